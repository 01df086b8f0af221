#!/usr/bin/env python3
"""dsv4_ops side by side with the reference engine's own kernels, in one process.

The peer kit (--peer-dir: the harness sgl_bench.py, stubs/ and the reference engine's wheels;
benchmarks/README.md says how to assemble it) is used as measuring equipment: its World
(case inputs), Bench (driver, correctness checks against its float64 model) and Timer (cold L2
and CUDA-graph replay). Every case of its case list runs twice, back to back: once through
the reference engine's API (the harness's import_api()) and once through an object exposing
the same attributes backed by dsv4_ops. The byte counts are the harness's own, so GB/s match.

    pip install --no-index --no-deps --target SITE PEER/wheels/*.whl     # once
    PYTHONPATH=PEER/stubs:SITE python benchmarks/peer_compare.py --peer-dir PEER --out DIR [--quick]

Writes peer_compare.json (both result lists, both check lists, the joined table, environment,
copy ceiling) and peer_compare.md under --out, and prints the joined table:
ratio = reference-engine time / dsv4_ops time (> 1: dsv4_ops faster), cold and graph.
Every head_dim-512 case also compares the two engines' fp8_ds_mla cache bytes on the same kv
rows (benchmarks/peer_store_match.py): one line per case with the UE8M0 bytes, e4m3 codes and
rope values that differ and which engine is nearer float64 there; a case that does not conform
(contract 4 as that script arbitrates it) fails the run (--no-store-match: skip).
Exit status: 0 everything ran and every check passed, 1 the harness / the reference engine /
dsv4_ops cannot be imported (nothing measured), 2 some case failed or some check failed,
3 the CUDA context was lost (partial results written).
--selftest-cpu runs the same driver on the CPU with the harness's stand-in API in place of the
reference engine (tests this script; measures nothing meaningful).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
import traceback
from types import SimpleNamespace
from typing import Any, Dict, List, Optional, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common as C
from benchmarks import peer_store_match as PSM

APIS = ("sglang", "dsv4")


def log(*a: Any) -> None:
    print(*a, flush=True)


# --------------------------------------------------------------------------------------
# The dsv4_ops API object, shaped like the harness's import_api() result
# --------------------------------------------------------------------------------------
class _V4PageLayout:
    """fp8_ds_mla page (docs/contract.md 4): 576-byte token rows, then 8 scale bytes per token, the page
    padded to a whole number of 576-byte rows."""

    name = "V4"

    @staticmethod
    def page_bytes(page_size: int) -> int:
        return -(-584 * page_size // 576) * 576


class DSV4KVLayout:
    V4 = _V4PageLayout()


def dsv4_api() -> SimpleNamespace:
    import dsv4_ops
    from dsv4_ops import compressor

    return SimpleNamespace(
        C=compressor, KVLayout=DSV4KVLayout,
        CompressorDecodePlan=dsv4_ops.CompressorDecodePlan,
        CompressorPrefillPlan=dsv4_ops.CompressorPrefillPlan,
        compress_forward=dsv4_ops.compress_forward,
        compress_norm_rope_store=dsv4_ops.compress_norm_rope_store,
    )


# --------------------------------------------------------------------------------------
# Harness loading
# --------------------------------------------------------------------------------------
PEER_KIT_HELP = (
    "the peer kit is a folder with the harness sgl_bench.py, stubs/ (the sglang package "
    "__init__ stand-ins) and wheels/ (sglang 0.5.23, apache-tvm-ffi 0.1.11, msgspec for the GPU "
    "machine's Python); see 'The peer kit' in benchmarks/README.md for how to obtain them")


def load_harness(peer_dir: str):
    path = os.path.join(peer_dir, "sgl_bench.py")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no peer harness {path} (--peer-dir {peer_dir}): {PEER_KIT_HELP}")
    if peer_dir not in sys.path:
        sys.path.insert(0, peer_dir)
    import sgl_bench  # noqa: WPS433

    return sgl_bench


def selftest_cases(H, torch
                   ) -> List[Tuple[str, Tuple[str, int, int], List[Tuple[int, int]], Any, str]]:
    """Small CPU cases (the harness's own case list is GPU-sized)."""
    import random

    rng = random.Random(11)
    out = []
    for combo in H.DEFAULT_COMBOS:
        label, hd, r = combo
        tag = f"{label}{hd}_c{r}_fp32"
        ctx = [rng.randint(*H.DECODE_CTX) for _ in range(4)]
        out.append((f"{tag}/dec_bs4_rand", combo, [(c, 1) for c in ctx], torch.float32, "decode"))
        out.append((f"{tag}/dec_bs4_bnd", combo, [(max(r, c // r * r), 1) for c in ctx],
                    torch.float32, "decode"))
        out.append((f"{tag}/p2x300+200", combo, [(500, 200), (300, 300)], torch.float32, "prefill"))
    return out


# --------------------------------------------------------------------------------------
# Joining the two result lists
# --------------------------------------------------------------------------------------
def _median(rec: Optional[Dict[str, Any]], key: str) -> Optional[float]:
    v = rec.get(key) if rec else None
    return v["median"] if v else None


def _primary(rec: Optional[Dict[str, Any]]) -> Tuple[Optional[float], str]:
    c = _median(rec, "cold_us")
    if c is not None:
        return c, "cold"
    return _median(rec, "wall_us"), "wall"


def join(results: Dict[str, List[Dict[str, Any]]], copy_gbps: Optional[float]
         ) -> List[Dict[str, Any]]:
    order: List[Tuple[str, str]] = []
    by: Dict[Tuple[str, str], Dict[str, Dict[str, Any]]] = {}
    for api in APIS:
        for r in results.get(api, []):
            key = (r.get("case"), r.get("op"))
            if key not in by:
                by[key] = {}
                order.append(key)
            by[key][api] = r
    rows = []
    for key in order:
        s, d = by[key].get("sglang"), by[key].get("dsv4")
        ts, kind = _primary(s)
        td, kind_d = _primary(d)
        gs, gd = _median(s, "graph_us"), _median(d, "graph_us")
        nbytes = (d or s or {}).get("bytes")
        row = {
            "case": key[0], "op": key[1], "timing": kind if ts is not None else kind_d,
            "bytes": nbytes,
            "sglang_us": ts, "dsv4_us": td, "ratio": (ts / td) if (ts and td) else None,
            "sglang_graph_us": gs, "dsv4_graph_us": gd,
            "ratio_graph": (gs / gd) if (gs and gd) else None,
            "sglang_gbps": (nbytes / (ts * 1e3)) if (nbytes and ts) else None,
            "dsv4_gbps": (nbytes / (td * 1e3)) if (nbytes and td) else None,
            "sglang_error": (s or {}).get("error"), "dsv4_error": (d or {}).get("error"),
        }
        row["dsv4_frac_copy"] = ((row["dsv4_gbps"] / copy_gbps)
                                 if (row["dsv4_gbps"] and copy_gbps) else None)
        rows.append(row)
    return rows


def _f(x, nd=1, w=9):
    return f"{'-':>{w}}" if x is None else f"{x:>{w}.{nd}f}"


HEADER = (f"{'case':<34} {'op':<16} {'sgl_us':>9} {'dsv4_us':>9} {'ratio':>6} {'sgl_g':>9} "
          f"{'dsv4_g':>9} {'ratio_g':>7} {'MB':>8} {'sgl_GB/s':>8} {'dsv4_GB/s':>9}")


def format_joined(r: Dict[str, Any]) -> str:
    mb = r["bytes"] / 1e6 if r.get("bytes") else None
    s = (f"{str(r['case'])[:34]:<34} {str(r['op'])[:16]:<16} {_f(r['sglang_us'])} "
         f"{_f(r['dsv4_us'])} {_f(r['ratio'], 2, 6)} {_f(r['sglang_graph_us'])} "
         f"{_f(r['dsv4_graph_us'])} {_f(r['ratio_graph'], 2, 7)} "
         f"{C._g(mb, 8)} {C._g(r['sglang_gbps'], 8)} {C._g(r['dsv4_gbps'], 9)}")
    if r["timing"] == "wall":
        s += " (wall)"
    for api in APIS:
        if r.get(f"{api}_error"):
            s += f" {api.upper()}-ERR {str(r[f'{api}_error'])[:100]}"
    return s


def markdown(joined, checks, info, copy_gbps, summary) -> List[str]:
    def c(x, nd=1):
        return "" if x is None else f"{x:.{nd}f}"

    def g(x):
        return C._g(x, 0).strip() if x else ""

    lines = ["# dsv4_ops vs the reference engine (sglang) kernels", "",
             f"GPU {info.get('gpu')}; sglang {info.get('sglang_version')}; "
             f"torch {info.get('torch')}; "
             f"copy bandwidth {c(copy_gbps, 0)} GB/s; dsv4_ops {info.get('git', '?')}", "",
             "Times are medians in microseconds: cold = L2 flushed before each call (wall = host "
             "wall clock incl. synchronize, for planners fed host lengths); graph = per call in a "
             "CUDA-graph replay. ratio = sglang / dsv4 (> 1: dsv4_ops faster). Bytes: the "
             "harness's minimum-traffic model.", "",
             f"Summary: {json.dumps(summary, default=str)}", "",
             "| case | op | sglang us | dsv4 us | ratio | sglang graph us | dsv4 graph us | "
             "ratio graph | MB | sglang GB/s | dsv4 GB/s | note |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in joined:
        note = "; ".join(f"{a}: {str(r[f'{a}_error'])[:80]}" for a in APIS if r.get(f"{a}_error"))
        if r["timing"] == "wall":
            note = ("wall " + note).strip()
        mb = r["bytes"] / 1e6 if r.get("bytes") else None
        lines.append(f"| {r['case']} | {r['op']} | {c(r['sglang_us'])} | {c(r['dsv4_us'])} | "
                     f"{c(r['ratio'], 2)} | {c(r['sglang_graph_us'])} | {c(r['dsv4_graph_us'])} | "
                     f"{c(r['ratio_graph'], 2)} | {g(mb)} | "
                     f"{g(r['sglang_gbps'])} | {g(r['dsv4_gbps'])} | {note.replace('|', '/')} |")
    lines += ["", "## correctness checks of the harness", ""]
    for api in APIS:
        cs = checks.get(api, [])
        bad = [x for x in cs if not x.get("ok")]
        lines.append(f"- {api}: {len(cs) - len(bad)}/{len(cs)} ok")
        for x in bad[:40]:
            lines.append(f"  - FAILED {json.dumps(x, default=str)[:300]}")
    return lines


def geomean(xs: List[float]) -> Optional[float]:
    import math

    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer-dir", required=True,
                    help="the peer kit: sgl_bench.py, stubs/, wheels/ (benchmarks/README.md)")
    ap.add_argument("--out", default=os.environ.get("OUT") or "peer_compare_out")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default=None, help="regex on the harness's case names")
    ap.add_argument("--state-dtypes", default="fp32,bf16")
    ap.add_argument("--all-combos", action="store_true")
    ap.add_argument("--c4-req-ring", action="store_true")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--reps-prefill", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--graph-replays", type=int, default=20)
    ap.add_argument("--no-graph", action="store_true")
    ap.add_argument("--apis", default=",".join(APIS),
                    help="which of sglang,dsv4 to run (default both)")
    ap.add_argument("--no-precompile", action="store_true", help="let sglang JIT-compile lazily")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no new case after this many seconds")
    ap.add_argument("--no-store-match", action="store_true",
                    help="skip the fp8_ds_mla byte comparison of the head_dim-512 cases "
                         "(benchmarks/peer_store_match.py)")
    ap.add_argument("--selftest-cpu", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    if args.quick:
        args.reps, args.reps_prefill, args.graph_replays = 30, 10, 5
    apis = [a for a in args.apis.split(",") if a]
    if any(a not in APIS for a in apis):
        ap.error(f"--apis: choose from {APIS}")
    os.makedirs(args.out, exist_ok=True)
    peer_dir = os.path.abspath(args.peer_dir)
    info: Dict[str, Any] = {"peer_dir": peer_dir, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
                            "git": C.git_tree()}

    # -- imports: the harness, then (stub-first) sglang, then dsv4_ops -----------------
    try:
        H = load_harness(peer_dir)
        H.setup_import_path()
        H.prepare_toolchain(info)
    except Exception as e:  # noqa: BLE001
        log(f"[peer_compare] cannot load the peer harness from {peer_dir}: {type(e).__name__}: {e}")
        if not isinstance(e, FileNotFoundError):
            traceback.print_exc()
        return 1
    import torch

    info.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
                python=sys.version.split()[0])
    api_objs: Dict[str, Any] = {}
    if "sglang" in apis:
        try:
            if args.selftest_cpu:
                api_objs["sglang"] = H.make_fake_api(
                    torch, SimpleNamespace(C=None, KVLayout=DSV4KVLayout))
                info["sglang_version"] = "stand-in (selftest)"
            else:
                import sglang

                if not getattr(sglang, "PEER_STUB", False):
                    raise ImportError(f"the stub sglang package is not first on sys.path: "
                                      f"{sglang.__file__} "
                                      f"(put {peer_dir}/stubs first on PYTHONPATH)")
                api_objs["sglang"] = H.import_api()
                try:
                    from importlib.metadata import version

                    info["sglang_version"] = version("sglang")
                except Exception:  # noqa: BLE001
                    info["sglang_version"] = "unknown"
                info["sglang_compress_module"] = getattr(api_objs["sglang"].C, "__file__", None)
        except Exception as e:  # noqa: BLE001
            log(f"[peer_compare] cannot import the reference engine (sglang): "
                f"{type(e).__name__}: {e}")
            log(f"  (install {peer_dir}/wheels/*.whl into a folder SITE with pip install "
                f"--no-index --no-deps --target SITE and run with PYTHONPATH={peer_dir}/stubs:SITE; "
                f"{PEER_KIT_HELP})")
            traceback.print_exc()
            return 1
    if "dsv4" in apis:
        try:
            api_objs["dsv4"] = dsv4_api()
            import dsv4_ops

            info["dsv4_library"] = dsv4_ops.ops._library.LIBRARY_PATH
        except Exception as e:  # noqa: BLE001
            log(f"[peer_compare] cannot import dsv4_ops: {type(e).__name__}: {e}")
            traceback.print_exc()
            return 1
    for k, v in info.items():
        log(f"[env] {k}: {v}")

    # -- device, timer, ceiling -----------------------------------------------------------
    if args.selftest_cpu:
        dev = torch.device("cpu")
        timer = H._FakeTimer()
        args.reps, args.reps_prefill, args.graph_replays, args.no_graph = 2, 2, 2, True
    else:
        if not torch.cuda.is_available():
            log("[peer_compare] needs a CUDA GPU")
            return 1
        dev = torch.device("cuda")
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, cc=f"{p.major}.{p.minor}", sm_count=p.multi_processor_count)
        timer = H.Timer(torch, H.FLUSH_BYTES, dev)
    combos = H.DEFAULT_COMBOS + (H.EXTRA_COMBOS if args.all_combos else [])
    sdts = [{"fp32": torch.float32, "bf16": torch.bfloat16}[s]
            for s in args.state_dtypes.split(",")]
    if "sglang" in api_objs and not args.selftest_cpu and not args.no_precompile:
        t0 = time.time()
        try:
            from sglang.kernels.jit.utils import parallel_compile

            builders = H.module_builders(api_objs["sglang"], torch, combos, sdts)
            parallel_compile([fn for _, fn in builders], max_workers=os.cpu_count())
            info["sglang_precompile"] = f"ok, {time.time() - t0:.1f} s"
        except Exception as e:  # noqa: BLE001 (modules then compile on first use)
            info["sglang_precompile"] = f"failed ({type(e).__name__}: {str(e)[:300]}); lazy compile"
        log(f"[jit] {info['sglang_precompile']}")
    ceiling = C.copy_bandwidth(C.Timer(dev))
    log(f"[ceiling] device copy {ceiling['gbps']:.0f} GB/s (read+write)")

    benches: Dict[str, Any] = {}
    for name, api in api_objs.items():
        a = copy.copy(args)
        benches[name] = H.Bench(a, torch, api, info, dev=dev, timer=timer)
        if dev.type == "cuda" and not args.no_graph:
            probe = H.probe_graph(benches[name])
            info[f"graph_probe_{name}"] = probe
            log(f"[graph] {name} probe: {probe}")
            if probe != "ok":
                a.no_graph = True

    cases = selftest_cases(H, torch) if args.selftest_cpu else H.build_case_list(args, torch)
    if args.selftest_cpu and args.only:
        import re

        cases = [c for c in cases if re.search(args.only, c[0])]
    log(f"[cases] {len(cases)} cases x {list(benches)}")
    log(H.HEADER)
    deadline = t_start + args.budget_s if args.budget_s else None  # JIT compile time included
    status, skipped = 0, []
    matches: List[Dict[str, Any]] = []
    match_apis = None
    if {"sglang", "dsv4"} <= set(api_objs) and not args.no_store_match:
        match_apis = {"sglang": (PSM.ReferenceModelStore(api_objs["sglang"]) if args.selftest_cpu
                                 else api_objs["sglang"]), "dsv4": api_objs["dsv4"]}
    t_run = time.time()
    for case_name, combo, reqs, sd, mode in cases:
        if deadline and time.monotonic() > deadline:
            skipped.append(case_name)
            continue
        lost = None
        for api_name, bench in benches.items():
            try:
                bench.run_case(f"{case_name}", combo, reqs, sd, mode)
            except Exception as e:  # noqa: BLE001
                log(f"{case_name} [{api_name}]: FAILED {type(e).__name__}: {e}")
                traceback.print_exc()
                bench.results.append({"case": case_name, "op": "*",
                                      "error": f"{type(e).__name__}: {e}"})
                status = 2
                lost = C.device_healthy(dev)
                if lost:
                    break
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
        if lost:
            log(f"[peer_compare] CUDA context unusable after {case_name}: {lost}; stopping")
            info["device_lost"] = f"after {case_name}: {lost}"
            status = 3
            break
        if match_apis and combo[1] == 512:
            try:
                m = PSM.match_case(H, match_apis, case_name, combo, reqs, sd, mode, dev)
            except Exception as e:  # noqa: BLE001
                traceback.print_exc()
                m = {"case": case_name, "error": f"{type(e).__name__}: {e}"}
            matches.append(m)
            log(PSM.summary_line(m))
            if not m.get("verdict", {}).get("ok"):
                status = status or 2
            if dev.type == "cuda":
                torch.cuda.empty_cache()

    results = {n: b.results for n, b in benches.items()}
    checks = {n: b.checks for n, b in benches.items()}
    joined = join(results, ceiling["gbps"])
    for n, cs in checks.items():
        if any(not c.get("ok") for c in cs) and status == 0:
            status = 2
    if any(r.get("error") for rs in results.values() for r in rs) and status == 0:
        status = 2
    summary = {
        "geomean_ratio_cold": geomean([r["ratio"] for r in joined if r["timing"] == "cold"]),
        "geomean_ratio_graph": geomean([r["ratio_graph"] for r in joined]),
        "geomean_ratio_cold_by_op": {op: geomean([r["ratio"] for r in joined if r["op"] == op])
                                     for op in sorted({r["op"] for r in joined})},
        "checks": {n: f"{sum(bool(c.get('ok')) for c in cs)}/{len(cs)} ok"
                   for n, cs in checks.items()},
        "run_seconds": round(time.time() - t_run, 1), "skipped_for_time": skipped,
        "store_match": (f"{sum(bool(m.get('verdict', {}).get('bytes_equal')) for m in matches)} "
                        f"of {len(matches)} cases bytes equal, "
                        f"{sum(bool(m.get('verdict', {}).get('ok')) for m in matches)} conform"),
    }
    payload = {"env": info, "ceiling": ceiling, "args": vars(args), "summary": summary,
               "joined": joined, "results": results, "checks": checks, "store_match": matches}
    with open(os.path.join(args.out, "peer_compare.json"), "w") as f:
        json.dump(payload, f, indent=1, default=str)
    md = markdown(joined, checks, info, ceiling["gbps"], summary)
    if matches:
        md += ["", "## fp8_ds_mla cache bytes against the reference engine (same kv rows)", "",
               "benchmarks/peer_store_match.py; docs/design/store_reference_match.md.", ""]
        md += PSM.markdown(matches)
    with open(os.path.join(args.out, "peer_compare.md"), "w") as f:
        f.write("\n".join(md) + "\n")

    log("")
    log("=" * 130)
    log(f"GPU {info.get('gpu')}  sglang {info.get('sglang_version')}  "
        f"copy {ceiling['gbps']:.0f} GB/s  ratio = sglang / dsv4 (> 1: dsv4_ops faster)")
    log(HEADER)
    for r in joined:
        log(format_joined(r))
    for n, cs in checks.items():
        bad = [c for c in cs if not c.get("ok")]
        log(f"checks {n}: {len(cs) - len(bad)}/{len(cs)} ok")
        for c in bad[:20]:
            log(f"  FAILED {json.dumps(c, default=str)[:300]}")
    for m in matches:
        log(PSM.summary_line(m))
    log(f"summary: {json.dumps(summary, default=str)}")
    if skipped:
        log(f"{len(skipped)} cases skipped by the time budget")
    log(f"wrote {args.out}/peer_compare.json and peer_compare.md (exit {status})")
    return status


if __name__ == "__main__":
    sys.exit(main())
