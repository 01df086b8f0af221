#!/usr/bin/env python3
"""Context-parallel prefill ops (docs/contract.md 8): compress_partials and merge_partials on one
device, as one rank of a group of 2 or 4 runs them.

Cases: main hd512 cr4, main hd512 cr128 and indexer hd128 cr4 (fp32 state and input) on the
prefill cases of compress_forward (benchmarks/bench_compress.py; p4x2000+2048 reads state rows),
the batch's ragged rows dealt to the ranks in blocks of 128, round-robin; rank 0 (the one that
reads the state) is timed. Rows per case:
* cp_partials      compress_partials of rank 0: its rows, the state rows its windows read,
                   written: the partials [3, W, hd] of every window and the persisted rows;
* cp_merge_rebase  merge_partials of rank 0's partial against the group's max (max_m) into a
                   partial: cp_compress's step between its two all-reduces;
* cp_merge_rows    merge_partials of the summed partial into the compressed rows: its last step;
* cp_merge_stack   merge_partials of all the ranks' partials [R, 3, W, hd] into rows (the
                   all-gathered-partials alternative).
Bytes: every input row, state row, partial, max and output read or written once; plan records
and input_rows counted (16 / 8 / 4 bytes). check (cp_partials rows): the ranks' partials merged
equal compress_forward's rows within 1e-6.

    python benchmarks/bench_cp.py [--quick] [--device cuda|cpu] [--only REGEX]
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, List, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from benchmarks import common as C
from benchmarks.bench_compress import prefill_plan

FAMILY = "cp"
RANKS = (2, 4)


def _shares(num_q: int, ranks: int, device) -> List[torch.Tensor]:
    q = torch.arange(num_q, device=device)
    return [q[(q // 128) % ranks == r] for r in range(ranks)]


def _check(w, plan, partials, hd) -> str:
    """The ranks' partials merged against compress_forward's rows."""
    import dsv4_ops

    want = torch.empty((plan.plan_c.shape[0], hd), device=w.device)
    dsv4_ops.compress_forward(w.state.clone(), w.kv_in, w.ape, plan, head_dim=hd,
                              compress_ratio=w.compress_ratio, out=want)
    got = torch.empty_like(want)
    dsv4_ops.ops.merge_partials_op(partials, None, got)
    err = float((got - want).abs().max()) if want.numel() else 0.0
    return "ok" if err <= 1e-6 * max(1.0, float(want.abs().max())) else f"max error {err:.2e}"


def case_rows(ctx: C.Context, name: str, hd: int, ratio: int, reqs, ranks: int
              ) -> List[Dict[str, Any]]:
    import dsv4_ops
    from dsv4_ops.distributed import ContextParallelPlan

    w = C.make_world(ratio=ratio, head_dim=hd, reqs=reqs, device=ctx.device,
                     seed=C.case_seed(name))
    plan = prefill_plan(w)
    windows, persisted = plan.plan_c.shape[0], plan.plan_w.shape[0]
    shares = _shares(w.num_q, ranks, w.device)
    cps = [ContextParallelPlan.generate(plan, s, w.num_q, read_state=r == 0)
           for r, s in enumerate(shares)]
    rows = [w.kv_in[s].contiguous() for s in shares]
    partials = torch.empty((ranks, 3, windows, hd), device=w.device)
    persist = w.kv_in.new_empty((persisted, w.kv_in.shape[1]))

    def partials_fn(r: int) -> Callable[[], Any]:
        return lambda: dsv4_ops.ops.compress_partials_op(
            w.state, rows[r], cps[r].input_rows, w.ape, cps[r].plan_c, cps[r].plan_w,
            partials[r], persist, hd, ratio, cps[r].read_state)

    for r in range(ranks):
        partials_fn(r)()
    ctx.timer.sync()
    check = _check(w, plan, partials, hd)
    max_m = partials[:, 0].amax(0)
    rebased = torch.empty((3, windows, hd), device=w.device)
    out = torch.empty((windows, hd), device=w.device)
    plane = windows * hd * 4
    es = w.kv_in.element_size()
    row_bytes = w.kv_in.shape[1] * es
    k = C.prefill_counts(w)
    mine = shares[0].shape[0]
    # rank 0's bytes: its rows, the state rows (all windows' state rows: it reads the state),
    # ape, plan_c, plan_w, input_rows; written: three planes and the persisted rows.
    b_partials = (mine * row_bytes + k["state_slots_read"] * 2 * hd * C.esize(w.state_dtype)
                  + w.ape.numel() * 4 + windows * 16 + persisted * 8 + w.num_q * 4
                  + 3 * plane + persisted * row_bytes)
    extra = dict(ranks=ranks, windows=windows, persisted=persisted, num_q=w.num_q,
                 rank_rows=mine, bs=w.batch_size)
    big = w.num_q >= 4096
    out_rows = [C.measure(ctx, name, "cp_partials", partials_fn(0), b_partials, big=big,
                          check=check, **extra)]
    merges = [("cp_merge_rebase", partials[:1], max_m, rebased, 3 * plane + plane + 3 * plane),
              ("cp_merge_rows", partials[:1], None, out, 3 * plane + plane),
              ("cp_merge_stack", partials, None, out, ranks * 3 * plane + plane)]
    for op, p, m, o, nbytes in merges:
        out_rows.append(C.measure(
            ctx, name, op, lambda p=p, m=m, o=o: dsv4_ops.ops.merge_partials_op(p, m, o),
            nbytes, big=big, **extra))
    return out_rows


def cases(ctx: C.Context) -> List[Tuple[str, Callable[[], List[Dict[str, Any]]]]]:
    out = []
    for label, hd, r in C.COMBOS:
        for pname, reqs in ctx.prefill_cases():
            for ranks in RANKS:
                name = f"{label}{hd}_c{r}/{pname}_cp{ranks}"
                out.append((name, lambda n=name, hd=hd, r=r, q=reqs, k=ranks:
                            case_rows(ctx, n, hd, r, q, k)))
    return out


def rows(ctx: C.Context) -> List[Dict[str, Any]]:
    return C.run_cases(ctx, cases(ctx), FAMILY)


def main() -> int:
    return C.family_main(FAMILY, rows, __doc__)


if __name__ == "__main__":
    sys.exit(main())
