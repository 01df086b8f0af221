#!/usr/bin/env python3
"""Planner benchmarks (docs/contract.md 3.2, 3.3, 3.5).

* decode planner, batch 1..1024, random context lengths: SWA-paged cr 4, request-ring
  cr 128, online cr 128 (and legacy cr 4 in full runs). Timed cold (CUDA events), as host
  wall time including a synchronize, and as CUDA-graph replay.
* prefill planner for 8x4096, 1x32768 and 4x(2000 prefix + 2048):
  - host lengths (seq_lens / extend_lens on the CPU, the usual prefill path): wall time,
    including the host-to-device copies and the trim of the padded plans;
  - device lengths (CUDA-graph capture / MTP path: no host sync): cold and graph replay.

Each row also carries `check`: the planner's record counts against the counts derived from
contract 3.3 / 3.5 in common.World (a sanity check of the case, not a test).

    python benchmarks/bench_plan.py [--quick] [--device cuda|cpu] [--only REGEX]
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, List, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from benchmarks import common as C

FAMILY = "plan"
# kind -> (ratio, use_req_ring / online flags)
DECODE_KINDS = [("c4_paged", 4), ("c128_ring", 128), ("online_c128", 128)]
FULL_ONLY_KINDS = [("c4_legacy", 4)]
PREFILL_KINDS = [("c4_paged", 4), ("c128_ring", 128), ("online_c128", 128)]


def _world(ctx: C.Context, name: str, kind: str, ratio: int, reqs) -> C.World:
    # head_dim does not matter to planners; 128 keeps the (unused, unfilled) buffers small
    return C.make_world(ratio=ratio, head_dim=128, reqs=reqs, device=ctx.device,
                        seed=C.case_seed(name), online=kind.startswith("online"),
                        use_req_ring=kind == "c4_legacy", fill=False)


def _count_check(got: Tuple[int, int], want: Tuple[int, int]) -> str:
    return "ok" if tuple(got) == tuple(want) else f"records {tuple(got)} != expected {tuple(want)}"


def decode_case(ctx: C.Context, name: str, kind: str, ratio: int, bs: int) -> List[Dict[str, Any]]:
    import dsv4_ops

    seqs = C.decode_lengths(bs, "rand", ratio, C.case_seed(name))
    w = _world(ctx, name, kind, ratio, [(s, 1) for s in seqs])
    P = dsv4_ops.CompressorDecodePlan
    if kind == "online_c128":
        fn = lambda: P.generate_online(w.seq_lens, w.rid, w.req_to_token, state_slot_offset=0)  # noqa: E731
    elif kind == "c4_legacy":
        fn = lambda: P.generate_legacy(ratio, w.rid, w.seq_lens)  # noqa: E731
    else:
        fn = lambda: P.generate(ratio, w.rid, w.req_to_token, w.full_to_state, w.seq_lens, C.SWA_PAGE, w.ring,  # noqa: E731
                                use_req_ring=False)
    plan = fn()
    check = ("ok" if tuple(plan.plan_d.shape) == (bs, 16)
             else f"plan shape {tuple(plan.plan_d.shape)}")
    return [C.measure(ctx, name, "plan_decode", fn, C.bytes_decode_plan(w), wall=True, bs=bs,
                      check=check)]


def prefill_case(ctx: C.Context, name: str, kind: str, ratio: int, reqs) -> List[Dict[str, Any]]:
    import dsv4_ops

    w = _world(ctx, name, kind, ratio, reqs)
    P = dsv4_ops.CompressorPrefillPlan
    online = kind == "online_c128"
    if online:
        k = C.online_prefill_counts(w)
        nbytes = C.bytes_online_prefill_plan(w, k["n_c"], k["n_w"])

        def gen(seq, ext, graph):
            return P.generate_online(seq, ext, w.rid, w.req_to_token, w.num_q, use_cuda_graph=graph)
    else:
        k = C.prefill_counts(w)
        nbytes = C.bytes_prefill_plan(w, k["n_c"], k["n_w"])

        def gen(seq, ext, graph):
            return P.generate(ratio, w.rid, seq, ext, w.req_to_token, w.full_to_state, C.SWA_PAGE, w.ring, w.num_q,
                              use_cuda_graph=graph, use_req_ring=False)

    want = (k["n_c"], k["n_w"])
    host = gen(w.seq_lens_cpu, w.extend_lens_cpu, False)
    check_host = _count_check((host.plan_c.shape[0], host.plan_w.shape[0]), want)
    dev = gen(w.seq_lens, w.extend_lens, True)
    check_dev = _count_check(tuple(int(x) for x in dev.counts.cpu().tolist()), want)
    big = w.num_q >= 4096
    extra = dict(bs=w.batch_size, num_q=w.num_q, n_compress=k["n_c"], n_write=k["n_w"])
    rows = [C.measure(ctx, name, "plan_prefill_hostlens", lambda: gen(w.seq_lens_cpu, w.extend_lens_cpu, False),
                      nbytes, big=big, cold=False, wall=True, graph=False, check=check_host,
                      **extra)]
    rows.append(C.measure(ctx, name, "plan_prefill_devlens", lambda: gen(w.seq_lens, w.extend_lens, True),
                          nbytes, big=big, check=check_dev, **extra))
    return rows


def cases(ctx: C.Context) -> List[Tuple[str, Callable[[], List[Dict[str, Any]]]]]:
    out = []
    kinds = DECODE_KINDS + ([] if (ctx.quick or ctx.smoke) else FULL_ONLY_KINDS)
    bss = C.DECODE_BS if not ctx.smoke else C.SMOKE_DECODE_BS
    if ctx.quick:
        bss = [1, 64, 1024]
    for kind, ratio in kinds:
        for bs in bss:
            name = f"{kind}/dec_bs{bs}"
            out.append((name, lambda n=name, k=kind, r=ratio, b=bs: decode_case(ctx, n, k, r, b)))
    for kind, ratio in PREFILL_KINDS:
        for pname, reqs in ctx.prefill_cases():
            name = f"{kind}/{pname}"
            out.append((name, lambda n=name, k=kind, r=ratio, q=reqs:
                        prefill_case(ctx, n, k, r, q)))
    return out


rows = C.family_rows(FAMILY, cases)

if __name__ == "__main__":
    sys.exit(C.family_main(FAMILY, rows, __doc__))
