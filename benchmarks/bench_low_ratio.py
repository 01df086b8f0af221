#!/usr/bin/env python3
"""The V4.1 ops alone (docs/contract.md V4.1): c2_norm_rope_store (ratio-2 decode, verify),
c2_prefill_norm_rope_store, c1_norm_rope_store (ratio 1, decode and prefill rows),
low_ratio_index_k_store (ratios 1 and 2), kv_store and compress_norm_rope_store into the
V4.1 layouts (`cnrs`), through the drop-in Python layer,
on the cases of benchmarks/peer_low_ratio.py (the same inputs, byte model and names; the
reference engine's side is peer_low_ratio's). --quick: layouts v41_fp4 and v4, decode batch 8
and 1024; --smoke: peer_low_ratio's tiny self-test cases. check: every slot the case stores
holds data after one call (the cache starts zeroed).

    python benchmarks/bench_low_ratio.py [--quick] [--device cuda|cpu] [--only REGEX]
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, List, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from benchmarks import common as C
from benchmarks import peer_low_ratio as P

FAMILY = "low_ratio"


def _case_rows(ctx: C.Context, case: P.Case) -> List[Dict[str, Any]]:
    inp = P.build_inputs(case, ctx.device)
    outs = P.fresh_outputs(inp)
    fn = P.call_fn(P.dsv4_api(), inp, outs)
    fn()
    ctx.timer.sync()
    expected = int(P.stored_slots(inp).numel())
    got = P.slots_with_data(outs["cache"].view(torch.uint8).reshape(-1), inp)
    check = "ok" if got == expected else f"slots stored {got} != {expected}"
    return [C.measure(ctx, case.name, case.op, fn, P.case_bytes(inp), big=inp["n"] >= 4096,
                      rows=inp["n"], layout=case.layout, check=check)]


def cases(ctx: C.Context) -> List[Tuple[str, Callable[[], List[Dict[str, Any]]]]]:
    return [(c.name, lambda c=c: _case_rows(ctx, c))
            for c in P.case_list(quick=ctx.quick, selftest=ctx.smoke)]


rows = C.family_rows(FAMILY, cases)

if __name__ == "__main__":
    sys.exit(C.family_main(FAMILY, rows, __doc__))
