"""The plumbing of the side-by-side scripts (peer_low_ratio.py, peer_spec.py, peer_fused.py):
loading the reference engine through the peer kit, building its JIT modules, the timing
settings, the first call and the timing of every engine of a case, the loop over the cases,
the two-engine table (ratio = reference / dsv4_ops) and the result files."""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from benchmarks import common as C

APIS = ("sglang", "dsv4")
REF_PKG = "sglang.kernels.ops.attention.dsv4"


def log(*a: Any) -> None:
    print(*a, flush=True)


# --------------------------------------------------------------------------------------
# Command line, environment, engines
# --------------------------------------------------------------------------------------
def add_args(ap: argparse.ArgumentParser, out_default: str, quick_help: str,
             peer_help: str = "the peer kit: sgl_bench.py, stubs/, wheels/") -> None:
    """The first options of every side-by-side script (its own follow, then add_run_args)."""
    ap.add_argument("--peer-dir", default=None, help=peer_help)
    ap.add_argument("--out", default=os.environ.get("OUT") or out_default)
    ap.add_argument("--quick", action="store_true", help=quick_help)


def add_run_args(ap: argparse.ArgumentParser, selftest_help: str, budget: bool = True) -> None:
    """The last options: case selection, repetitions, graph timing, time budget, --selftest."""
    ap.add_argument("--only", default=None, help="regex on the case names")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--no-graph", action="store_true")
    if budget:
        ap.add_argument("--budget-s", type=float, default=None,
                        help="start no new case after this many seconds")
    ap.add_argument("--selftest", action="store_true", help=selftest_help)


def parse(ap: argparse.ArgumentParser, argv, cases_of: Callable[[argparse.Namespace], List]
          ) -> Tuple[argparse.Namespace, float, Dict[str, Any], List]:
    """(args, start time, environment info, the cases --only selects) of a run; --peer-dir
    is required unless --selftest."""
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    os.makedirs(args.out, exist_ok=True)
    info: Dict[str, Any] = {"time": time.strftime("%Y-%m-%d %H:%M:%S"),
                            "torch": torch.__version__, "python": sys.version.split()[0]}
    cases = cases_of(args)
    if args.only:
        cases = [c for c in cases if re.search(args.only, c.name)]
    if not args.selftest and not args.peer_dir:
        ap.error("--peer-dir is required (or --selftest)")
    return args, t_start, info, cases


def begin(info: Dict[str, Any], device, cases: Sequence[Any], header: str,
          show_ceiling: bool = False) -> Tuple[C.Timer, Optional[Dict[str, Any]]]:
    """(timer, copy ceiling on CUDA): the environment (with the tree's git state) and the
    table header logged."""
    info["git"] = C.git_tree()
    for k, v in info.items():
        log(f"[env] {k}: {v}")
    timer = C.Timer(device)
    ceiling = C.copy_bandwidth(timer) if timer.is_cuda else None
    if ceiling and show_ceiling:
        log(f"[ceiling] device copy {ceiling['gbps']:.0f} GB/s (read+write)")
    log(f"[cases] {len(cases)}")
    log(header)
    return timer, ceiling


@dataclass
class Settings:
    reps: int = 100
    reps_big: int = 20
    warmup: int = 5
    graph_replays: int = 10
    no_graph: bool = False
    floors: Dict[int, float] = field(default_factory=dict)


def load_peer(tool: str, peer_dir: str, info: Dict[str, Any], sglang_fn, dsv4_fn
              ) -> Optional[Dict[str, Any]]:
    """{"sglang": sglang_fn(), "dsv4": dsv4_fn()} through the peer kit's stub packages, with the
    reference's version and the GPU in `info`; None (logged) if the kit, the reference, dsv4_ops
    or a CUDA GPU is missing."""
    try:
        from benchmarks.peer_compare import load_harness

        peer_dir = os.path.abspath(peer_dir)
        H = load_harness(peer_dir)
        H.setup_import_path()
        H.prepare_toolchain(info)
        import sglang

        if not getattr(sglang, "PEER_STUB", False):
            raise ImportError(f"the stub sglang package is not first on sys.path: "
                              f"{sglang.__file__} (put {peer_dir}/stubs first on PYTHONPATH)")
        apis = {"sglang": sglang_fn(), "dsv4": dsv4_fn()}
        try:
            from importlib.metadata import version

            info["sglang_version"] = version("sglang")
        except Exception:  # noqa: BLE001
            info["sglang_version"] = "unknown"
    except Exception as e:  # noqa: BLE001
        log(f"[{tool}] cannot load the peer kit / the reference / dsv4_ops: "
            f"{type(e).__name__}: {e}")
        traceback.print_exc()
        return None
    if not torch.cuda.is_available():
        log(f"[{tool}] needs a CUDA GPU (or --selftest)")
        return None
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    info.update(gpu=p.name, cc=f"{p.major}.{p.minor}", torch_cuda=torch.version.cuda)
    return apis


def prebuild(builders, info: Dict[str, Any]) -> None:
    """Builds the reference's JIT modules ((name, zero-argument builder) pairs) in parallel."""
    t0 = time.time()
    fns = [fn for _, fn in builders]
    try:
        from sglang.kernels.jit.utils import parallel_compile

        parallel_compile(fns, max_workers=os.cpu_count())
        info["sglang_precompile"] = f"ok ({len(fns)} modules), {time.time() - t0:.1f} s"
    except Exception as e:  # noqa: BLE001 (then each module compiles on first use)
        info["sglang_precompile"] = (f"failed ({type(e).__name__}: {str(e)[:300]}); lazy "
                                     f"compile")
    log(f"[jit] {info['sglang_precompile']}")


def engines(tool: str, args, info: Dict[str, Any], selftest_apis: Callable[[], Dict[str, Any]],
            selftest_version: str, sglang_fn, dsv4_fn,
            builders: Callable[[Any], List[Tuple[str, Callable[[], Any]]]]
            ) -> Optional[Tuple[Dict[str, Any], torch.device, Settings]]:
    """(apis, device, settings) of the run: --selftest's CPU stand-in, else the peer kit's
    reference with its JIT modules built; None when the peer kit cannot be loaded."""
    s = Settings()
    if args.selftest:
        device = torch.device("cpu")
        apis = selftest_apis()
        info["sglang_version"] = selftest_version
        s.reps = s.reps_big = s.warmup = s.graph_replays = 1
    else:
        apis = load_peer(tool, args.peer_dir, info, sglang_fn, dsv4_fn)
        if apis is None:
            return None
        device = torch.device("cuda", torch.cuda.current_device())
        s.reps, s.reps_big, s.warmup, s.graph_replays = ((30, 8, 3, 5) if args.quick
                                                         else (100, 20, 5, 10))
        prebuild(builders(apis["sglang"]), info)
    if args.reps:
        s.reps = args.reps
    s.no_graph = args.no_graph
    return apis, device, s


# --------------------------------------------------------------------------------------
# One case: first calls, timings
# --------------------------------------------------------------------------------------
def copy_floor_us(timer: C.Timer, s: Settings, nbytes: int) -> Optional[float]:
    """Cold time of a device copy moving `nbytes` (read + write), cached per size rounded to
    three significant digits."""
    if not timer.is_cuda or nbytes <= 0:
        return None
    key = int(float(f"{nbytes:.3g}"))
    if key not in s.floors:
        st = C.copy_bandwidth(timer, max(1, key // 2), s.reps_big)
        s.floors[key] = st["time_us"]["median"]
    return s.floors[key]


def _note_failure(rec: Dict[str, Any], key: str, prefix: str, e: Exception, timer: C.Timer,
                  width: int = 300) -> None:
    """rec[key] = the failure's message; a lost CUDA context raises DeviceLost."""
    rec[key] = f"{prefix}{type(e).__name__}: {str(e)[:width]}"
    lost = C.device_healthy(timer.device)
    if lost:
        raise C.DeviceLost(lost) from e


def first_calls(starts: Dict[str, Callable[[], Tuple[Any, Callable[[], Any]]]], timer: C.Timer,
                rec: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Callable[[], Any]]]:
    """({engine: outputs}, {engine: call}) after one call of every engine; starts[engine]()
    makes its outputs and its zero-argument call. A failing engine is noted in `rec`
    ("<engine>_error") and has no call; a lost CUDA context raises DeviceLost."""
    outs, fns = {}, {}
    for name, start in starts.items():
        try:
            outs[name], fns[name] = start()
            fns[name]()
            timer.sync()
        except Exception as e:  # noqa: BLE001
            fns.pop(name, None)
            _note_failure(rec, f"{name}_error", "", e, timer)
    return outs, fns


def shared_input_calls(apis: Dict[str, Any], inp: Dict[str, Any], fresh, call, timer: C.Timer,
                       rec: Dict[str, Any]):
    """first_calls of every engine on the case's inputs `inp`, each on its own outputs
    fresh(inp), through call(api, inp, outputs)."""
    def start(api):
        outs = fresh(inp)
        return outs, call(api, inp, outs)

    return first_calls({n: (lambda a=a: start(a)) for n, a in apis.items()}, timer, rec)


def time_calls(fns: Dict[str, Callable[[], Any]], timer: C.Timer, s: Settings, big: bool,
               rec: Dict[str, Any]) -> None:
    """rec[engine] = {"cold_us", "graph_us"} of every call, the engines' repetitions
    interleaved (Timer.cold_each, graph_each); a failure is noted as "<engine>_error", a graph
    capture's as rec[engine]["graph_error"]."""
    reps = s.reps_big if big else s.reps
    try:
        cold = timer.cold_each(fns, reps, s.warmup)
    except Exception:  # noqa: BLE001 (time each alone to name the engine that fails)
        cold = {}
        for name, fn in fns.items():
            try:
                cold[name] = timer.cold(fn, reps, s.warmup)
            except Exception as e:  # noqa: BLE001
                _note_failure(rec, f"{name}_error", "timing: ", e, timer)
    for name, st in cold.items():
        rec[name] = {"cold_us": st}
    if not timer.is_cuda or s.no_graph:
        return
    per_graph = 3 if big else 20
    graphs = {}
    for name in cold:
        try:
            graphs[name] = timer.capture(fns[name], per_graph)
        except Exception as e:  # noqa: BLE001
            _note_failure(rec[name], "graph_error", "", e, timer, 200)
    if graphs:
        for name, st in timer.graph_each(graphs, per_graph, s.graph_replays).items():
            rec[name]["graph_us"] = st


# --------------------------------------------------------------------------------------
# The loop over the cases and the result files
# --------------------------------------------------------------------------------------
def run_all(tool: str, cases: Sequence[Any], run_one: Callable[[Any], Dict[str, Any]],
            failed: Callable[[Any, str], Dict[str, Any]], joined: Callable[[Dict[str, Any]], Dict],
            text: Callable[[Dict[str, Any]], str], timer: C.Timer, info: Dict[str, Any],
            deadline: Optional[float] = None
            ) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]], List[str], int]:
    """(records, joined rows, cases skipped for time, exit status) of every case: run_one(case)
    its record, failed(case, message) the record of a case whose builder raised; status 2 when
    a row has a note, 3 (and the loop stops) when the CUDA context is lost."""
    recs, rows, skipped, status = [], [], [], 0
    for case in cases:
        if deadline and time.monotonic() > deadline:
            skipped.append(case.name)
            continue
        try:
            rec = run_one(case)
        except C.DeviceLost as e:
            log(f"[{tool}] CUDA context unusable after {case.name}: {e}; stopping")
            info["device_lost"] = f"after {case.name}: {e}"
            status = 3
            break
        except Exception as e:  # noqa: BLE001 (a builder bug: keep the other cases)
            traceback.print_exc()
            rec = failed(case, f"case: {type(e).__name__}: {str(e)[:300]}")
        if timer.is_cuda:
            torch.cuda.empty_cache()
        recs.append(rec)
        row = joined(rec)
        rows.append(row)
        log(text(row))
        if row["note"] and status == 0:
            status = 2
    return recs, rows, skipped, status


def write_results(out_dir: str, stem: str, payload: Dict[str, Any], lines: List[str]) -> None:
    """out_dir/stem.json (the payload) and out_dir/stem.md (the lines)."""
    with open(os.path.join(out_dir, f"{stem}.json"), "w") as f:
        json.dump(payload, f, indent=1, default=str)
    with open(os.path.join(out_dir, f"{stem}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


# --------------------------------------------------------------------------------------
# The two-engine table (peer_low_ratio, peer_spec)
# --------------------------------------------------------------------------------------
def _med(rec, api, key) -> Optional[float]:
    v = (rec.get(api) or {}).get(key)
    return v["median"] if v else None


def joined_row(rec: Dict[str, Any]) -> Dict[str, Any]:
    ts, td = _med(rec, "sglang", "cold_us"), _med(rec, "dsv4", "cold_us")
    gs, gd = _med(rec, "sglang", "graph_us"), _med(rec, "dsv4", "graph_us")
    fl = rec.get("floor_us")
    conf = rec.get("conformance")
    return {
        "case": rec["case"], "op": rec["op"], "prefill": rec.get("prefill"),
        "bytes": rec["bytes"],
        "sglang_us": ts, "dsv4_us": td, "ratio": ts / td if ts and td else None,
        "sglang_graph_us": gs, "dsv4_graph_us": gd,
        "ratio_graph": gs / gd if gs and gd else None,
        "floor_us": fl, "dsv4_pct_floor": 100 * fl / td if fl and td else None,
        "sglang_pct_floor": 100 * fl / ts if fl and ts else None,
        "conform": None if conf is None else ("ok" if conf["ok"] else "FAIL"),
        "note": "; ".join([f"{a}: {rec[a + '_error']}" for a in APIS if rec.get(a + "_error")]
                          + [f"{a} {rec[a]['graph_error']}" for a in APIS
                             if (rec.get(a) or {}).get("graph_error")])
                + ("" if not conf or conf["ok"] else f" {json.dumps(conf)}"),
    }


def summarize(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    def med(xs):
        xs = [x for x in xs if x]
        return statistics.median(xs) if xs else None

    ratios = [r["ratio"] for r in rows if r["ratio"]]
    slowest = min((r for r in rows if r["ratio"]), key=lambda r: r["ratio"], default=None)
    graphs = [r["ratio_graph"] for r in rows if r["ratio_graph"]]
    pre = [r for r in rows if r.get("prefill")]
    return {
        "cases": len(rows),
        "conform": f"{sum(r['conform'] == 'ok' for r in rows)}/"
                   f"{sum(r['conform'] is not None for r in rows)} ok",
        "median_ratio": med(ratios), "min_ratio": min(ratios) if ratios else None,
        "min_ratio_case": slowest and slowest["case"],
        "median_ratio_graph": med(graphs), "min_ratio_graph": min(graphs) if graphs else None,
        "median_prefill_dsv4_pct_floor": med([r["dsv4_pct_floor"] for r in pre]),
        "median_prefill_sglang_pct_floor": med([r["sglang_pct_floor"] for r in pre]),
        "prefill_dsv4_pct_floor": {r["case"]: r["dsv4_pct_floor"] for r in pre},
        "prefill_sglang_pct_floor": {r["case"]: r["sglang_pct_floor"] for r in pre},
        "errors": sum(bool(r["note"]) for r in rows),
    }


def summary_line(sm: Dict[str, Any]) -> str:
    def f(x, nd=2):
        return "-" if x is None else f"{x:.{nd}f}"

    return (f"SUMMARY ratio sglang/dsv4 cold: median {f(sm['median_ratio'])}, min "
            f"{f(sm['min_ratio'])} ({sm['min_ratio_case']}); graph: median "
            f"{f(sm['median_ratio_graph'])}, min {f(sm['min_ratio_graph'])}; prefill % floor "
            f"dsv4 median {f(sm['median_prefill_dsv4_pct_floor'], 1)}, sglang median "
            f"{f(sm['median_prefill_sglang_pct_floor'], 1)}; conform {sm['conform']}; "
            f"cases with a note {sm['errors']}")


def fmt(x, nd=1):
    return "" if x is None else f"{x:.{nd}f}"


def env_line(info: Dict[str, Any], ceiling: Optional[Dict[str, Any]]) -> str:
    """The GPU, the reference's version, torch, the copy bandwidth and the dsv4_ops files of a
    run (common.git_tree; the run's time stays in the JSON)."""
    return (f"GPU {info.get('gpu')}; sglang {info.get('sglang_version')}; torch "
            f"{info.get('torch')}; copy bandwidth {fmt(ceiling and ceiling.get('gbps'), 0)} GB/s; "
            f"dsv4_ops {info.get('git', '?')}")


def md_row(r: Dict[str, Any], cols) -> str:
    """A markdown table row of `r`: cols = (key or function of r, decimals; None: text)."""
    cells = []
    for key, nd in cols:
        v = key(r) if callable(key) else r.get(key)
        if key == "note":
            cells.append(v.replace("|", "/")[:200])
        else:
            cells.append(str(v or "") if nd is None else fmt(v, nd))
    return "| " + " | ".join(cells) + " |"


def text_line(r: Dict[str, Any], cols) -> str:
    """A fixed-width log line of `r`: cols = (key, decimals (None: text), width); the note
    after them."""
    cells = []
    for key, nd, w in cols:
        v = r.get(key)
        if nd is None:
            cells.append(f"{(v or '-')[:w]:<{w}}")
        else:
            cells.append(f"{'-':>{w}}" if v is None else f"{v:>{w}.{nd}f}")
    return " ".join(cells) + (f" {r['note'][:160]}" if r["note"] else "")


HEADER = ("| case | sglang us | dsv4 us | ratio | sglang graph us | dsv4 graph us | ratio graph | "
          "MB | floor us | dsv4 % floor | sglang % floor | conform | note |")
MD_COLS = (("case", None), ("sglang_us", 1), ("dsv4_us", 1), ("ratio", 2),
           ("sglang_graph_us", 1), ("dsv4_graph_us", 1), ("ratio_graph", 2),
           (lambda r: r["bytes"] and r["bytes"] / 1e6, 3), ("floor_us", 1),
           ("dsv4_pct_floor", 1), ("sglang_pct_floor", 1), ("conform", None), ("note", None))
TEXT_COLS = (("case", None, 40), ("sglang_us", 1, 9), ("dsv4_us", 1, 9), ("ratio", 2, 6),
             ("sglang_graph_us", 1, 9), ("dsv4_graph_us", 1, 9), ("ratio_graph", 2, 6),
             ("dsv4_pct_floor", 1, 6), ("conform", None, 5))


def markdown(rows, summary, info, ceiling, title: str) -> List[str]:
    _c = fmt
    lines = [title, "", env_line(info, ceiling), "",
             "Medians in microseconds: cold = L2 flushed before each call; graph = per call in a "
             "CUDA-graph replay. ratio = sglang / dsv4 (> 1: dsv4_ops faster). floor = cold time "
             "of a device copy moving the case's bytes (read + written); % floor = floor / time.",
             "", summary_line(summary), "", "Prefill % floor (dsv4 / sglang): " + ", ".join(
                 f"{k} {_c(v)} / {_c(summary['prefill_sglang_pct_floor'].get(k))}"
                 for k, v in summary["prefill_dsv4_pct_floor"].items()), "", HEADER,
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    lines += [md_row(r, MD_COLS) for r in rows]
    return lines


def text_row(r) -> str:
    return text_line(r, TEXT_COLS)


TEXT_HEADER = (f"{'case':<40} {'sgl_us':>9} {'dsv4_us':>9} {'ratio':>6} {'sgl_g':>9} "
               f"{'dsv4_g':>9} {'rat_g':>6} {'%floor':>6} conf")
