#!/usr/bin/env python3
"""Kernel timelines of small decode steps: dsv4_ops and the reference engine, side by side.

A decode step under CUDA-graph replay is a chain of short kernels (compress, then store) whose
time is set by the hand-over between them: how early the next kernel is resident, and how long
it still runs once the kernel before it has ended. For 8 closing decode rows of each of the
harness's combos, PAIRS compress -> store pairs go into one CUDA graph, once per pairing of the
two engines' kernels (RR, DD, DR, RD: compress engine first; R = reference engine, D =
dsv4_ops). The last replay runs under torch.profiler (CUPTI kernel records); per pairing the
table gives medians over its pairs:
  graph us          per pair, the harness's graph timer (no profiler)
  store after C     store end - compress end: the store's work after its wait
  compress after S  next compress end - store end
  store lead        compress end - store start: how long the store was resident beforehand
The inputs, plans and engines come from the peer kit (as for benchmarks/peer_compare.py;
benchmarks/README.md says how to assemble it).

    PYTHONPATH=PEER/stubs:SITE python benchmarks/peer_timeline.py --peer-dir PEER --out DIR

Writes peer_timeline.json and peer_timeline.md under --out.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import zlib
from types import SimpleNamespace
from typing import Any, Dict, List, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import peer_compare as P

PAIRINGS = ("RR", "DD", "DR", "RD")


def kernel_spans(trace_path: str) -> List[Tuple[str, float, float]]:
    """(name, start us, end us) of every GPU kernel record of a torch.profiler chrome trace."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    spans = [(e["name"], float(e["ts"]), float(e["ts"]) + float(e["dur"]))
             for e in events if e.get("cat") == "kernel"]
    return sorted(spans, key=lambda s: s[1])


def hand_over(spans: List[Tuple[str, float, float]], pairs: int) -> Dict[str, float]:
    """Medians over the last `pairs` compress -> store pairs of a timeline."""
    last = spans[-2 * pairs:]
    comp, store = last[0::2], last[1::2]
    med = statistics.median
    return {
        "store_after_compress_us": med(s[2] - c[2] for c, s in zip(comp, store)),
        "compress_after_store_us": med(comp[i + 1][2] - store[i][2] for i in range(pairs - 1)),
        "store_lead_us": med(c[2] - s[1] for c, s in zip(comp, store)),
        "period_us": (last[-1][2] - last[0][1]) / pairs,
        "compress_kernel": comp[0][0][:80],
        "store_kernel": store[0][0][:80],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer-dir", required=True,
                    help="the peer kit: sgl_bench.py, stubs/, wheels/ (benchmarks/README.md)")
    ap.add_argument("--out", default=os.environ.get("OUT") or "peer_timeline_out")
    ap.add_argument("--bs", type=int, default=8, help="decode rows, every one closing a window")
    ap.add_argument("--pairs", type=int, default=20, help="compress -> store pairs per graph")
    args = ap.parse_args(argv)

    try:
        H = P.load_harness(os.path.abspath(args.peer_dir))
    except FileNotFoundError as e:
        print(f"peer_timeline: {e}")
        return 1
    H.setup_import_path()
    info: Dict[str, Any] = {}
    H.prepare_toolchain(info)
    import torch
    from torch.profiler import ProfilerActivity, profile

    if not torch.cuda.is_available():
        print("peer_timeline: needs a CUDA device")
        return 1
    dev = torch.device("cuda")
    engines = {"R": H.import_api(), "D": P.dsv4_api()}
    # the harness's Bench reads these options (only its plan / compress / store helpers run here)
    bench_args = SimpleNamespace(c4_req_ring=False, reps=30, reps_prefill=10, warmup=5,
                                 graph_replays=30, no_graph=False)
    timer = H.Timer(torch, H.FLUSH_BYTES, dev)
    rng = random.Random(7)
    rows = []
    for label, hd, ratio in H.DEFAULT_COMBOS:
        lengths = [rng.randint(*H.DECODE_CTX) for _ in range(args.bs)]
        reqs = [(max(ratio, n // ratio * ratio), 1) for n in lengths]  # every row closes
        name = f"{label}{hd}_c{ratio}/dec_bs{args.bs}_bnd"
        setups = {}
        for key, api in engines.items():
            bench = H.Bench(bench_args, torch, api, info, dev=dev, timer=timer)
            world = H.World(torch, ratio=ratio, head_dim=hd, reqs=reqs, state_dtype=torch.float32,
                            device=dev, seed=zlib.crc32(name.encode()) % (1 << 30),
                            kv_layout=api.KVLayout.V4)
            setups[key] = (bench, world, bench.plan_decode(world))
        for pairing in PAIRINGS:
            bc, wc, pc = setups[pairing[0]]
            bs_, ws, ps = setups[pairing[1]]

            def step(bc=bc, wc=wc, pc=pc, bs_=bs_, ws=ws, ps=ps):
                bs_.store(ws, bc.compress(wc, pc), ps)

            graph_us = timer.graph(step, args.pairs, 30)["median"]
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                step()  # warm-up outside the capture
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(args.pairs):
                    step()
            graph.replay()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                graph.replay()
                torch.cuda.synchronize()
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "trace.json")
                prof.export_chrome_trace(path)
                spans = kernel_spans(path)
            last = spans[-2 * args.pairs:]
            if len(last) < 2 * args.pairs or len({s[0] for s in last[0::2]}) != 1 or \
                    len({s[0] for s in last[1::2]}) != 1:
                print(f"{name} {pairing}: not {args.pairs} alternating compress / store kernel "
                      f"records ({len(spans)} records)")
                continue
            row = {"case": name, "pairing": pairing, "graph_us": graph_us}
            row.update(hand_over(spans, args.pairs))
            rows.append(row)
            print(f"{name:28s} {pairing}  graph {graph_us:5.2f}  store after C "
                  f"{row['store_after_compress_us']:5.2f}  compress after S "
                  f"{row['compress_after_store_us']:5.2f}  store lead {row['store_lead_us']:5.2f}",
                  flush=True)
        del setups
        torch.cuda.empty_cache()

    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "peer_timeline.json"), "w") as f:
        json.dump({"rows": rows, "env": info, "git": P.C.git_tree()}, f, indent=1)
    lines = ["| case | pairing | graph us | store after C | compress after S | store lead |",
             "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {r['case']} | {r['pairing']} | {r['graph_us']:.2f} | "
              f"{r['store_after_compress_us']:.2f} | {r['compress_after_store_us']:.2f} | "
              f"{r['store_lead_us']:.2f} |" for r in rows]
    with open(os.path.join(args.out, "peer_timeline.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
