#!/usr/bin/env python3
"""The online cr 128 draft ops alone (docs/contract.md 10): a verify step of B requests x D
tokens with the staging ops (`step`: mark_pending, commit_pending, write_prefix_states),
write_prefix_states alone (`stage`) and the commit (`commit`), through the drop-in Python layer,
on the cases of benchmarks/peer_spec.py (the same inputs, byte model and names; the reference
engine's side is peer_spec's). B in 1, 8, 64, 256 and D in 2, 4, 7; --quick: B 8 and 256, D 4
and 7; --smoke: peer_spec's self-test cases. check: the staged banks match peer_spec's
plain-PyTorch stand-in of the contract.

    python benchmarks/bench_spec.py [--quick] [--device cuda|cpu] [--only REGEX]
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, List, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import common as C
from benchmarks import peer_spec as P

FAMILY = "spec"


def _case_rows(ctx: C.Context, case: P.Case) -> List[Dict[str, Any]]:
    inp = P.build_inputs(case, ctx.device)
    outs = P.fresh_outputs(inp)
    fn = P.call_fn(P.dsv4_api(), inp, outs)
    fn()
    ctx.timer.sync()
    check = "ok"
    if ctx.smoke:  # the stand-in is a Python loop: small cases only
        want = P.fresh_outputs({**inp, "state": inp["state"].cpu()})
        P.call_fn(P.StandIn(), {**{k: (v.cpu() if hasattr(v, "cpu") else v)
                                   for k, v in inp.items()}}, want)()
        conf = P.conformance(inp, want, {k: v.cpu() for k, v in outs.items()})
        check = "ok" if conf["ok"] else f"differs from the stand-in: {conf}"
    return [C.measure(ctx, case.name, f"spec_{case.op}", fn, P.case_bytes(inp),
                      rows=inp["n"], check=check)]


def cases(ctx: C.Context) -> List[Tuple[str, Callable[[], List[Dict[str, Any]]]]]:
    return [(c.name, lambda c=c: _case_rows(ctx, c))
            for c in P.case_list(quick=ctx.quick, selftest=ctx.smoke)]


rows = C.family_rows(FAMILY, cases)

if __name__ == "__main__":
    sys.exit(C.family_main(FAMILY, rows, __doc__))
