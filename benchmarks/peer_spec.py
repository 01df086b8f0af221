#!/usr/bin/env python3
"""The online cr 128 draft ops (docs/contract.md 10) side by side with the reference engine's
(sglang 0.5.23 `online_c128_mtp`, loaded through the peer kit), in one process.

A case is a verify step of B requests x D tokens at hd 512, fp32 state and rows (the reference's
only dtypes): request rows scattered over 2B + 1 slots, committed lengths at random chunk
offsets (some closing a chunk inside the verify), accepted prefixes 1..D. Every case builds one
set of inputs; each engine gets its own copy of the state and the pending lengths, runs the
same drop-in calls, is checked against the other, then is timed cold (L2 flushed before every
call) and under CUDA-graph replay (benchmarks/common.py's Timer). Ops:
  step     the three ops of a step: mark_pending(previous lengths), commit_pending(committed
           lengths), write_prefix_states (every iteration commits and stages the same work)
  stage    write_prefix_states alone
  commit   mark_pending(previous) + commit_pending (the mark restores the pending lengths)
B in 1, 8, 64, 256 and D in 2, 4, 7 (--quick: B 8, 256; D 4, 7).
Conformance: pending lengths equal; committed slots (byte copies) equal; staged banks: m bit
for bit, S and K within 1e-5 relative (the reference folds with fast math; dsv4_ops as its
online decode); every other state row untouched by both.

    pip install --no-index --no-deps --target SITE PEER/wheels/*.whl        # once
    PYTHONPATH=PEER/stubs:SITE python3 -m benchmarks.peer_spec --peer-dir PEER --out DIR [--quick]
    python3 -m benchmarks.peer_spec --selftest [--out DIR]                  # CPU, no peer kit

Writes spec.json and spec.md under --out; ratio = reference / dsv4_ops (> 1: dsv4_ops
faster). Exit status: 0 all ran and conform, 1 nothing measured (imports), 2 some case failed
or did not conform, 3 the CUDA context was lost. --selftest: tiny cases on the CPU, dsv4_ops
against a plain-PyTorch stand-in of contract 10 (float64 folds); measures nothing meaningful.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Dict, List

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from benchmarks import common as C
from benchmarks import peer_common as PC

HEAD_DIM = 512
BATCHES = (1, 8, 64, 256)
WIDTHS = (2, 4, 7)
QUICK_BATCHES = (8, 256)
QUICK_WIDTHS = (4, 7)
SELFTEST = ((2, 3), (3, 2))
OPS = ("step", "stage", "commit")
REF_MODULE = PC.REF_PKG + ".online_c128_mtp"


@dataclass(frozen=True)
class Case:
    op: str
    batch: int
    verify: int
    head_dim: int = HEAD_DIM

    @property
    def name(self) -> str:
        return f"{self.op}/b{self.batch}/d{self.verify}"

    is_prefill = False
    layout = "online"
    page_size = 0


def case_list(quick: bool = False, selftest: bool = False) -> List[Case]:
    if selftest:
        return [Case(op, b, d, 128) for op in OPS for b, d in SELFTEST]
    bs, ds = (QUICK_BATCHES, QUICK_WIDTHS) if quick else (BATCHES, WIDTHS)
    return [Case(op, b, d) for op in OPS for b in bs for d in ds]


def build_inputs(case: Case, device, seed: int = 0) -> Dict[str, Any]:
    """One verify step's tensors. State rows: (D + 1) banks of `slots` = 2B + 1 rows."""
    gen = torch.Generator().manual_seed(seed + 1000 * case.batch + case.verify)
    B, D, hd = case.batch, case.verify, case.head_dim
    slots = 2 * B + 1
    rid = torch.randperm(slots, generator=gen)[:B]
    prev = torch.randint(1, 4096, (B,), generator=gen)
    prev[::3] = (prev[::3] // 128) * 128 + 128 - torch.randint(1, D + 1, (len(prev[::3]),),
                                                                generator=gen)
    accept = torch.randint(1, D + 1, (B,), generator=gen)
    cur = prev + accept
    state = torch.randn(slots * (D + 1), 3 * hd, generator=gen)
    state[:, hd:2 * hd] = state[:, hd:2 * hd].abs() + 0.5
    x = torch.randn(B * D, 2 * hd, generator=gen)
    ape = 0.5 * torch.randn(128, hd, generator=gen)
    dev = torch.device(device)
    return {"case": case, "n": B * D, "rid": rid.to(dev), "prev": prev.to(dev),
            "cur": cur.to(dev), "state": state.to(dev), "x": x.to(dev), "ape": ape.to(dev),
            "req_to_token": torch.zeros(slots, 8, dtype=torch.int32, device=dev),
            "slots": slots}


def fresh_outputs(inp: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    return {"state": inp["state"].clone(),
            "pending": torch.full((inp["slots"],), -1, dtype=torch.int64,
                                  device=inp["state"].device)}


def call_fn(api, inp: Dict[str, Any], outs: Dict[str, torch.Tensor]) -> Callable[[], Any]:
    case: Case = inp["case"]
    B, D, hd, slots = case.batch, case.verify, case.head_dim, inp["slots"]
    st, pend, r2t = outs["state"], outs["pending"], inp["req_to_token"]

    def mark():
        api.online_c128_mtp_mark_pending(inp["prev"], inp["rid"], pend, B, slots, head_dim=hd,
                                         state_dtype=st.dtype)

    def commit():
        api.online_c128_mtp_commit_pending(inp["cur"], inp["rid"], r2t, pend, st, B, D, slots,
                                           slots, head_dim=hd)

    def stage():
        api.online_c128_mtp_write_prefix_states(inp["x"], inp["cur"], inp["rid"], r2t,
                                                inp["ape"], st, B, D, slots, head_dim=hd)

    if case.op == "stage":
        return stage
    if case.op == "commit":
        return lambda: (mark(), commit())
    return lambda: (mark(), commit(), stage())


def case_bytes(inp: Dict[str, Any]) -> int:
    """Minimum bytes one call moves (read + written)."""
    case: Case = inp["case"]
    B, D, hd = case.batch, case.verify, case.head_dim
    row = 3 * hd * 4
    stage = B * D * 2 * hd * 4 + B * row + 128 * hd * 4 + B * D * row
    commit = 2 * B * row + B * 8 * 3 + inp["slots"] * 8
    return {"stage": stage, "commit": commit, "step": stage + commit}[case.op]


def dsv4_api() -> SimpleNamespace:
    from dsv4_ops import spec

    return SimpleNamespace(name="dsv4_ops", **{n: getattr(spec, n) for n in (
        "online_c128_mtp_write_prefix_states", "online_c128_mtp_mark_pending",
        "online_c128_mtp_commit_pending")})


def sglang_api() -> SimpleNamespace:
    import importlib

    m = importlib.import_module(REF_MODULE)
    return SimpleNamespace(name="sglang", module=m, **{
        "online_c128_mtp_write_prefix_states": m.online_c128_mtp_write_prefix_states,
        "online_c128_mtp_mark_pending": m.online_c128_mtp_mark_pending,
        "online_c128_mtp_commit_pending": m.online_c128_mtp_commit_pending})


def sglang_builders(api) -> List[Callable[[], Any]]:
    m = api.module
    return [lambda: m._jit_online_c128_mtp_module(HEAD_DIM, torch.int64, torch.int64,
                                                   torch.float32)]


class StandIn:
    """Contract 9 in plain PyTorch (float64 folds, one request at a time): what --selftest
    compares dsv4_ops with."""
    name = "stand-in"

    @staticmethod
    def online_c128_mtp_mark_pending(seq_lens, req_pool_indices, pending, batch_size,
                                     num_req_slots, *, head_dim, state_dtype):
        if batch_size <= 0:
            return
        pending[:num_req_slots] = -1
        for b in range(batch_size):
            r = int(req_pool_indices[b])
            if 0 <= r < num_req_slots:
                pending[r] = int(seq_lens[b])

    @staticmethod
    def online_c128_mtp_commit_pending(seq_lens, req_pool_indices, req_to_token, pending, state,
                                       batch_size, num_verify_tokens, stride, num_req_slots, *,
                                       head_dim):
        for b in range(batch_size):
            r = int(req_pool_indices[b])
            if not 0 <= r < num_req_slots or int(pending[r]) < 0:
                continue
            old = int(pending[r])
            acc = max(0, min(int(seq_lens[b]) - old, num_verify_tokens))
            if acc > 0 and (old + acc) % 128:
                state[r] = state[r + acc * stride]

    @staticmethod
    def online_c128_mtp_write_prefix_states(x, seq_lens, req_pool_indices, req_to_token, ape,
                                            state, batch_size, num_verify_tokens, stride, *,
                                            head_dim):
        hd, D = head_dim, num_verify_tokens
        for b in range(batch_size):
            r, s = int(req_pool_indices[b]), int(seq_lens[b])
            m = torch.full((hd,), -float("inf"), dtype=torch.float64)
            S = torch.zeros(hd, dtype=torch.float64)
            K = torch.zeros(hd, dtype=torch.float64)
            if s % 128:
                m, S, K = (state[r, i * hd:(i + 1) * hd].double() for i in range(3))
            for i in range(D):
                q = (s + i) % 128
                kv = x[b * D + i, :hd].double()
                z = x[b * D + i, hd:].double() + ape[q].double()
                if q == 0:
                    m, S, K = z, torch.ones(hd, dtype=torch.float64), kv
                else:
                    M = torch.maximum(m, z)
                    a, e = S * torch.exp(m - M), torch.exp(z - M)
                    m, S, K = M, a + e, (K * a + kv * e) / (a + e)
                if (s + i + 1) % 128:
                    state[r + (i + 1) * stride] = torch.cat([m, S, K]).to(state.dtype)


def conformance(inp: Dict[str, Any], ref: Dict[str, torch.Tensor],
                ours: Dict[str, torch.Tensor]) -> Dict[str, Any]:
    hd = inp["case"].head_dim
    out: Dict[str, Any] = {"pending_equal": bool(torch.equal(ref["pending"], ours["pending"]))}
    a, b = ref["state"].cpu(), ours["state"].cpu()
    same = (a.view(torch.int32) == b.view(torch.int32)).all(dim=1)
    out["rows_differing"] = int((~same).sum())
    m_ok = bool(torch.equal(a[:, :hd].view(torch.int32), b[:, :hd].view(torch.int32)))
    rel = ((a[:, hd:] - b[:, hd:]).abs() / (1 + a[:, hd:].abs())).max().item() if a.numel() else 0
    out.update(m_bitwise=m_ok, max_rel_sk=rel)
    out["ok"] = out["pending_equal"] and m_ok and rel <= 1e-5
    return out


def run_case(case: Case, apis: Dict[str, Any], timer: C.Timer, s: PC.Settings, device
             ) -> Dict[str, Any]:
    inp = build_inputs(case, device)
    rec: Dict[str, Any] = {"case": case.name, "op": case.op, "prefill": False, "rows": inp["n"],
                           "bytes": case_bytes(inp)}
    outs, fns = PC.shared_input_calls(apis, inp, fresh_outputs, call_fn, timer, rec)
    if len(fns) == 2:
        rec["conformance"] = conformance(inp, outs["sglang"], outs["dsv4"])
    PC.time_calls(fns, timer, s, False, rec)
    rec["floor_us"] = PC.copy_floor_us(timer, s, rec["bytes"])
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    PC.add_args(ap, "peer_spec_out", "B 8 and 256, D 4 and 7",
                peer_help="the peer kit: stubs/, wheels/")
    PC.add_run_args(ap, "CPU: tiny cases, dsv4_ops against the plain-PyTorch stand-in",
                    budget=False)
    args, t_start, info, cases = PC.parse(ap, argv, lambda a: case_list(a.quick, a.selftest))
    run = PC.engines("peer_spec", args, info, lambda: {"sglang": StandIn(), "dsv4": dsv4_api()},
                     "plain-PyTorch stand-in (selftest)", sglang_api, dsv4_api,
                     lambda api: [("online_c128_mtp", f) for f in sglang_builders(api)])
    if run is None:
        return 1
    apis, device, s = run
    timer, ceiling = PC.begin(info, device, cases, PC.TEXT_HEADER)
    recs, rows, _, status = PC.run_all(
        "peer_spec", cases, lambda c: run_case(c, apis, timer, s, device),
        lambda c, msg: {"case": c.name, "op": c.op, "prefill": False, "bytes": None,
                        "dsv4_error": msg},
        PC.joined_row, PC.text_row, timer, info)
    summary = PC.summarize(rows)
    summary.update(run_seconds=round(time.monotonic() - t_start, 1))
    payload = {"env": info, "ceiling": ceiling, "args": vars(args), "summary": summary,
               "joined": rows, "records": recs}
    PC.write_results(args.out, "spec", payload, PC.markdown(
        rows, summary, info, ceiling,
        "# dsv4_ops speculative-decoding ops vs the reference engine (sglang) kernels"))
    log(PC.summary_line(summary))
    log(f"wrote {args.out}/spec.json and spec.md (exit {status})")
    return status


log = PC.log

if __name__ == "__main__":
    sys.exit(main())
