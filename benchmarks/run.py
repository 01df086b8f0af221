#!/usr/bin/env python3
"""Run every dsv4_ops benchmark family on the current device and write the results.

    python benchmarks/run.py [--quick] [--only REGEX] [--out DIR]
                             [--families plan,compress,store,step,fused,low_ratio,cp,spec]
                             [--peer-dir PEER | --peer-selftest]

Prints one table (time, bytes moved, effective bandwidth, % of the device copy bandwidth
measured in the same run, speed-up over the plain-PyTorch reference) and writes, under --out:
  results.json   every row with all timings, the environment and the copy ceiling
  results.md     the table in markdown
  bandwidth.png  achieved GB/s per case (bars: cold; dots: CUDA-graph replay) against a
                 horizontal line at the measured copy bandwidth, one panel per family
  peer.png       with --peer-dir: reference / dsv4_ops per case of the families that have a
                 side-by-side script (low_ratio: peer_low_ratio.py, fused: peer_fused.py, spec:
                 peer_spec.py; bars: cold; dots: CUDA-graph replay), whose rows results.md and
                 results.json ("peer") also hold. PEER is the peer kit (benchmarks/README.md);
                 run with its PYTHONPATH (PEER/stubs:SITE). --peer-selftest: the scripts' CPU
                 stand-ins instead of the reference engine.
results.json is rewritten after every family, so an interrupted run keeps what it measured.
Exit status: 0 all rows measured, 1 some rows failed, 2 dsv4_ops not importable, 3 the CUDA
context was lost (later families skipped).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common as C

FAMILIES = ["plan", "compress", "store", "step", "fused", "low_ratio", "cp", "spec"]


def family_functions():
    from benchmarks import (bench_compress, bench_cp, bench_fused, bench_low_ratio, bench_plan,
                            bench_spec, bench_store)

    return {"plan": bench_plan.rows, "compress": bench_compress.rows, "store": bench_store.rows,
            "step": bench_store.step_rows, "fused": bench_fused.rows,
            "low_ratio": bench_low_ratio.rows, "cp": bench_cp.rows, "spec": bench_spec.rows}


# family -> (side-by-side script, the stem of the results it writes)
PEER_SCRIPTS = {"low_ratio": ("peer_low_ratio", "low_ratio"), "fused": ("peer_fused", "fused"),
                "spec": ("peer_spec", "spec")}


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a and b else None


def peer_rows(family: str, joined: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """A side-by-side script's joined rows as dsv4_ops against the reference engine (fused:
    compress_and_store against the reference's unfused pair); ratio = reference / dsv4_ops."""
    out = []
    for r in joined:
        if family == "fused":
            ours, ref = r.get("fused_us"), r.get("ref_us")
            ours_g, ref_g = r.get("fused_graph_us"), r.get("ref_graph_us")
            conform = ("ok" if r.get("pair_conform") == "ok" and r.get("ref_conform") == "ok"
                       else f"pair {r.get('pair_conform')}, ref {r.get('ref_conform')}")
        else:
            ours, ref = r.get("dsv4_us"), r.get("sglang_us")
            ours_g, ref_g = r.get("dsv4_graph_us"), r.get("sglang_graph_us")
            conform = r.get("conform")
        out.append({"family": family, "case": r.get("case"), "ours_us": ours, "ref_us": ref,
                    "ratio": _ratio(ref, ours), "ours_graph_us": ours_g, "ref_graph_us": ref_g,
                    "ratio_graph": _ratio(ref_g, ours_g), "conform": conform})
    return out


def run_peers(args) -> Tuple[List[Dict[str, Any]], List[str]]:
    """(rows, notes): the side-by-side script of every selected family that has one, each in
    a child process writing under OUT/peer/<family>."""
    rows: List[Dict[str, Any]] = []
    notes: List[str] = []
    fams = [f.strip() for f in args.families.split(",")]
    for fam in [f for f in PEER_SCRIPTS if f in fams]:
        script, stem = PEER_SCRIPTS[fam]
        sub = os.path.join(args.out, "peer", fam)
        cmd = [sys.executable, "-m", f"benchmarks.{script}", "--out", sub]
        cmd += ["--selftest"] if args.peer_selftest else ["--peer-dir", args.peer_dir]
        if args.quick:
            cmd.append("--quick")
        C.log(f"[run] side by side {fam}: {' '.join(cmd)}")
        rc = subprocess.call(cmd, cwd=C.REPO_ROOT)
        try:
            with open(os.path.join(sub, stem + ".json")) as f:
                joined = json.load(f).get("joined", [])
        except Exception as e:  # noqa: BLE001
            notes.append(f"side by side {fam}: no {stem}.json ({type(e).__name__}), exit {rc}")
            continue
        rows += peer_rows(fam, joined)
        if rc != 0:
            notes.append(f"side by side {fam} exited with {rc}")
    return rows, notes


def _med(xs: List[float]) -> Optional[float]:
    xs = sorted(x for x in xs if x)
    return xs[len(xs) // 2] if xs else None


def peer_markdown(rows: List[Dict[str, Any]]) -> List[str]:
    def f(x, nd=2):
        return "-" if x is None else f"{x:.{nd}f}"

    lines = ["", "## beside the reference engine", "",
             "ratio = reference / dsv4_ops (> 1: dsv4_ops faster); fused: compress_and_store "
             "against the reference's compress + store pair; conform: the script's output check.",
             ""]
    for fam in dict.fromkeys(r["family"] for r in rows):
        rs = [r for r in rows if r["family"] == fam]
        cold, graph = [r["ratio"] for r in rs], [r["ratio_graph"] for r in rs]
        lo = min((x for x in cold if x), default=None)
        lo_g = min((x for x in graph if x), default=None)
        lines.append(f"{fam}: {len(rs)} cases, ratio median {f(_med(cold))} cold / "
                     f"{f(_med(graph))} graph, smallest {f(lo)} / {f(lo_g)}; conforming "
                     f"{sum(r['conform'] == 'ok' for r in rs)} of {len(rs)}")
    lines += ["", "| family | case | dsv4_ops us | reference us | ratio | dsv4_ops graph us | "
              "reference graph us | ratio graph | conform |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['family']} | {r['case']} | {f(r['ours_us'], 1)} | {f(r['ref_us'], 1)} | "
                     f"{f(r['ratio'])} | {f(r['ours_graph_us'], 1)} | {f(r['ref_graph_us'], 1)} | "
                     f"{f(r['ratio_graph'])} | {r['conform']} |")
    return lines


def plot_peer(path: str, rows: List[Dict[str, Any]], title: str) -> Optional[str]:
    """One panel per family: bars = reference / dsv4_ops cold, dots = under graph replay,
    dashed line at 1. Returns an error string instead of raising."""
    fams: Dict[str, List[Dict[str, Any]]] = {}
    for r in rows:
        fams.setdefault(r["family"], []).append(r)

    def draw(ax, rs):
        x = list(range(len(rs)))
        ax.bar(x, [r["ratio"] or 0.0 for r in rs], color="tab:blue", label="cold L2")
        gx = [i for i, r in zip(x, rs) if r["ratio_graph"]]
        if gx:
            ax.plot(gx, [rs[i]["ratio_graph"] for i in gx], "o", color="tab:orange",
                    markersize=3, label="graph replay")
        ax.axhline(1.0, color="tab:red", linestyle="--", label="equal time")
        vals = [v for r in rs for v in (r["ratio"], r["ratio_graph"]) if v]
        if vals and max(vals) / min(vals) > 50:
            ax.set_yscale("log")  # the CPU stand-ins are float64 models, far slower
        return [r["case"] for r in rs]

    return _plot_panels(path, fams, draw, "reference / dsv4_ops",
                        lambda fam: f"{title}: {fam} beside the reference engine")


def _clean(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [{k: v for k, v in r.items()} for r in rows]


def write_json(path: str, payload: Dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1, default=str)
    os.replace(tmp, path)


def write_markdown(path: str, rows, info: Dict[str, Any], copy: Dict[str, Any],
                   notes: List[str], peer: Optional[List[Dict[str, Any]]] = None) -> None:
    lines = ["# dsv4_ops benchmarks", ""]
    dev = info.get("gpu") or info.get("device")
    lines.append(f"device: {dev}; torch {info.get('torch')} (cuda {info.get('torch_cuda')}); "
                 f"dsv4_ops git {info.get('git', '?')}")
    if copy.get("gbps"):
        lines.append(f"copy bandwidth (device-to-device, read+write): {copy['gbps']:.0f} GB/s")
    lines += ["", "time us: cold-L2 median (CPU: wall-clock median); graph us: per call, "
              "CUDA-graph replay; MB: minimum DRAM traffic; % copy: GB/s over the copy bandwidth; "
              "% same-size copy: GB/s over that of a copy moving the same bytes, timed the same "
              "way (cold rows of at least 1 MB: a short op pays the fixed costs a short copy "
              "pays); x ref: dsv4_ops.testing.reference time / dsv4_ops time.", ""]
    lines += C.markdown_table(rows)
    if peer:
        lines += peer_markdown(peer)
    if notes:
        lines += ["", "## notes", ""] + [f"- {n}" for n in notes]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def _plot_panels(path: str, groups: Dict[str, List[Dict[str, Any]]], draw, ylabel: str,
                 title_of) -> Optional[str]:
    """One panel per group, `draw(ax, rows)` drawing it and returning its x labels; saved to
    path. Returns an error string instead of raising."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001
        return f"matplotlib unavailable: {e}"
    widest = max(len(v) for v in groups.values())
    fig_w = min(max(8.0, 0.22 * widest + 2.0), 120.0)
    fig, axes = plt.subplots(len(groups), 1, figsize=(fig_w, 4.2 * len(groups)), squeeze=False)
    for ax, (name, rs) in zip(axes[:, 0], groups.items()):
        labels = draw(ax, rs)
        ax.set_xticks(list(range(len(rs))))
        ax.set_xticklabels(labels, rotation=90, fontsize=6)
        ax.set_xlim(-1, max(len(rs), 8))
        ax.set_ylabel(ylabel)
        ax.set_title(title_of(name), fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return None


def plot_bandwidth(path: str, rows, copy_gbps: Optional[float], title: str) -> Optional[str]:
    """One panel per family: bars = GB/s of the cold time, dots = GB/s of the graph time,
    dashed horizontal line = copy bandwidth. Returns an error string instead of raising."""
    fams: Dict[str, List[Dict[str, Any]]] = {}
    for r in rows:
        if r.get("gbps") or (r.get("bytes") and r.get("graph_us")):
            fams.setdefault(r.get("family", "?"), []).append(r)
    if not fams:
        return "no rows with a bandwidth to plot"

    def draw(ax, rs):
        x = list(range(len(rs)))
        cold = [r.get("gbps") or 0.0 for r in rs]
        graph = [(r["bytes"] / (r["graph_us"] * 1e3)) if (r.get("bytes") and r.get("graph_us"))
                 else None for r in rs]
        kind = "cold L2" if any(r.get("timing") == "cold" for r in rs) else "wall clock"
        ax.bar(x, cold, color="tab:blue", label=kind if any(cold) else None)
        gx = [i for i, g in zip(x, graph) if g]
        if gx:
            ax.plot(gx, [g for g in graph if g], "o", color="tab:orange", markersize=3,
                    label="graph replay")
        if copy_gbps:
            ax.axhline(copy_gbps, color="tab:red", linestyle="--",
                       label=f"copy {copy_gbps:.0f} GB/s")
        vals = [v for v in cold + [g for g in graph if g] if v and v > 0]
        if vals and (copy_gbps or max(vals)) / min(vals) > 50:
            ax.set_yscale("log")  # planners move kilobytes, prefill ops gigabytes
        return [f"{r['case']} {r['op']}" for r in rs]

    return _plot_panels(path, fams, draw, "GB/s", lambda fam: f"{title}: {fam}")


def report(args, info: Dict[str, Any], copy: Dict[str, Any], rows: List[Dict[str, Any]],
           payload: Dict[str, Any], skipped: List[str], json_path: str) -> int:
    """Notes, results.md, bandwidth.png, final results.json and the printed table; returns
    1 when some row failed, else 0."""
    bad_checks = [f"{r['case']} {r['op']}: {r['check']}" for r in rows
                  if r.get("check") not in (None, "ok")]
    errors = [r for r in rows if r.get("error")]
    notes = payload["notes"]
    if skipped:
        notes.append(f"{len(skipped)} cases skipped by the time budget: " + ", ".join(skipped[:20]))
    notes += [f"check: {b}" for b in bad_checks]
    notes += [f"error: {r['case']} {r['op']}: {str(r['error'])[:200]}" for r in errors]
    peer: List[Dict[str, Any]] = []
    if args.peer_dir or args.peer_selftest:
        peer, peer_notes = run_peers(args)
        notes += peer_notes
        payload["peer"] = peer
    ceiling = C.ceiling_row_of(copy, info.get("device", ""))
    all_rows = ([ceiling] if ceiling else []) + rows
    title = f"dsv4_ops on {info.get('gpu') or info.get('device')}"
    perr = plot_bandwidth(os.path.join(args.out, "bandwidth.png"), rows, copy.get("gbps"), title)
    if perr:
        notes.append(f"plot: {perr}")
    if peer:
        perr = plot_peer(os.path.join(args.out, "peer.png"), peer, title)
        if perr:
            notes.append(f"peer plot: {perr}")
    write_markdown(os.path.join(args.out, "results.md"), all_rows, info, copy, notes, peer)
    payload["rows"] = _clean(rows)
    write_json(json_path, payload)
    C.log("")
    C.log("=" * 120)
    gb = copy.get("gbps")
    C.log(f"{title}: copy {gb:.0f} GB/s; {len(rows)} rows in {payload.get('run_seconds')} s"
          if gb else f"{title}: no copy measurement; {len(rows)} rows")
    for line in C.format_table(all_rows):
        C.log(line)
    for line in (peer_markdown(peer) if peer else []):
        C.log(line)
    for n in notes:
        C.log(f"NOTE {n}")
    C.log(f"wrote {json_path}, results.md, bandwidth.png under {args.out}")
    return 1 if errors else 0


def passthrough(args) -> List[str]:
    out = []
    for flag in ("quick", "smoke", "no_graph", "no_ref"):
        if getattr(args, flag):
            out.append("--" + flag.replace("_", "-"))
    for opt in ("device", "only", "reps", "reps_big"):
        v = getattr(args, opt)
        if v is not None:
            out += ["--" + opt.replace("_", "-"), str(v)]
    return out


def run_isolated(args, fams: List[str]) -> int:
    """One child process per family (a kernel fault that kills the CUDA context then costs
    only its own family), merged into one report. Each child measures its own copy ceiling;
    the report's ceiling is the first one, all are kept in results.json (copy_per_family)."""
    t0 = time.monotonic()
    deadline = t0 + args.budget_s if args.budget_s else None
    json_path = os.path.join(args.out, "results.json")
    payload: Dict[str, Any] = {"env": {}, "args": vars(args), "copy": {}, "copy_per_family": {},
                               "rows": [], "notes": [], "family_status": {},
                               "bytes_model": C.__doc__}
    rows: List[Dict[str, Any]] = []
    skipped: List[str] = []
    status = 0
    for fam in fams:
        sub = os.path.join(args.out, "families", fam)
        cmd = [sys.executable, os.path.abspath(__file__), "--no-isolate", "--child",
               "--families", fam, "--out", sub] + passthrough(args)
        limit = None
        if deadline is not None:
            left = deadline - time.monotonic()
            if left < 5:
                payload["notes"].append(f"family {fam} not started: time budget spent")
                payload["family_status"][fam] = "not started (budget)"
                status = max(status, 1)
                continue
            cmd += ["--budget-s", f"{left:.0f}"]
            limit = left + 40  # the budget only stops new cases; let the running one finish
        C.log(f"[run] family {fam}: {' '.join(cmd)}")
        try:
            rc = subprocess.call(cmd, timeout=limit)
        except subprocess.TimeoutExpired:
            rc = "timeout"
        sub_json = os.path.join(sub, "results.json")
        try:
            with open(sub_json) as f:
                sp = json.load(f)
        except Exception as e:  # noqa: BLE001
            sp = None
            payload["notes"].append(f"family {fam}: no results.json ({type(e).__name__})")
        if sp:
            rows += sp.get("rows", [])
            payload["env"] = payload["env"] or sp.get("env", {})
            if sp.get("copy"):
                payload["copy_per_family"][fam] = sp["copy"]
                payload["copy"] = payload["copy"] or sp["copy"]
            payload["notes"] += [f"{fam}: {n}" for n in sp.get("notes", [])]
            skipped += sp.get("skipped_for_time", [])
        payload["family_status"][fam] = rc
        if rc != 0:
            payload["notes"].append(f"family {fam} exited with {rc}")
            status = max(status, 3 if rc == 3 else (2 if rc == 2 else 1))
        payload["rows"] = _clean(rows)
        write_json(json_path, payload)
    payload["run_seconds"] = round(time.monotonic() - t0, 1)
    payload["skipped_for_time"] = skipped
    info = payload["env"] or {"device": args.device or "?"}
    rc = report(args, info, payload["copy"], rows, payload, skipped, json_path)
    return max(status, rc)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    C.add_common_args(ap)
    ap.add_argument("--out", default=os.environ.get("DSV4_BENCH_OUT", "bench_out"))
    ap.add_argument("--families", default=",".join(FAMILIES),
                    help="comma list of " + ",".join(FAMILIES))
    ap.add_argument("--isolate", dest="isolate", action="store_true", default=None,
                    help="one process per family (default on CUDA)")
    ap.add_argument("--no-isolate", dest="isolate", action="store_false")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    peer = ap.add_mutually_exclusive_group()
    peer.add_argument("--peer-dir", default=None,
                      help="the peer kit: also run the side-by-side scripts (peer.png)")
    peer.add_argument("--peer-selftest", action="store_true",
                      help="the side-by-side scripts with their CPU stand-ins")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    fams = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = [f for f in fams if f not in FAMILIES]
    if unknown:
        ap.error(f"unknown families {unknown}")
    if args.isolate is None:
        import torch

        dev = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        args.isolate = dev.startswith("cuda")
    if args.isolate and len(fams) > 1:
        return run_isolated(args, fams)

    ctx = C.context_from_args(args)
    info = C.env_info(ctx.device)
    C.log(" ".join(f"{k}={v}" for k, v in info.items()))
    json_path = os.path.join(args.out, "results.json")
    payload: Dict[str, Any] = {"env": info, "args": vars(args), "copy": {}, "rows": [], "notes": [],
                               "bytes_model": C.__doc__}
    try:
        import dsv4_ops  # noqa: F401
        fns = family_functions()
    except Exception as e:  # noqa: BLE001
        msg = f"dsv4_ops not importable: {type(e).__name__}: {e}"
        C.log(msg)
        traceback.print_exc()
        payload["notes"].append(msg)
        write_json(json_path, payload)
        return 2

    ctx.measure_copy()
    payload["copy"] = ctx.copy
    rows: List[Dict[str, Any]] = []
    status = 0
    t0 = time.monotonic()
    C.log(C.TABLE_HEADER)
    for fam in fams:
        tf = time.monotonic()
        try:
            rows += fns[fam](ctx)
        except C.DeviceLost as e:
            note = f"device lost during {fam}: {e}; later families skipped"
            C.log(note)
            payload["notes"].append(note)
            status = 3
            break
        except Exception as e:  # noqa: BLE001 (a bug in a family script: keep the others)
            note = f"family {fam} crashed: {type(e).__name__}: {e}"
            C.log(note)
            traceback.print_exc()
            payload["notes"].append(note)
            status = max(status, 1)
        finally:
            payload["rows"] = _clean(rows)
            payload.setdefault("family_seconds", {})[fam] = round(time.monotonic() - tf, 1)
            payload["skipped_for_time"] = ctx.skipped_for_time
            write_json(json_path, payload)
    payload["run_seconds"] = round(time.monotonic() - t0, 1)
    if args.child:  # the parent merges and reports
        return status or (1 if any(r.get("error") for r in rows) else 0)
    rc = report(args, info, ctx.copy, rows, payload, ctx.skipped_for_time, json_path)
    return max(status, rc)


if __name__ == "__main__":
    sys.exit(main())
