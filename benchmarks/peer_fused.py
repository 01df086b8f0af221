#!/usr/bin/env python3
"""compress_and_store (docs/contract.md 11) side by side with the pair it replaces, ours and
the reference engine's (sglang 0.5.23 `compress_forward` then `compress_norm_rope_store`, as
the seed consumer's `_forward_compress_all_in_one` calls them), in one process.

Cases (name = kernel_format/dec_bs{B}_{pattern}): decode steps of B = 1, 8, 64, 256, 1024
requests (--quick: 8, 64, 1024) of c4 main hd512 (fp8_ds_mla), c4 indexer hd128 (fp4_indexer),
c128 main offline and c128 main online (fp8_ds_mla), fp32 state and input rows, in a step that
closes every request's window ("bnd") and in one that closes none ("open"). Every case builds
one world (benchmarks/common.py make_world, as bench_fused.py); each engine plans with its own
planner, gets its own copy of the state and a zeroed cache, and is called the seed's way (the
state viewed [-1, ratio, row] / online [-1, 1, 3 hd], compress_forward allocating its rows):
  fused  dsv4_ops.compress_and_store without `out`
  pair   dsv4_ops.compress_forward, then dsv4_ops.compress_norm_rope_store
  ref    the reference's compress_forward, then its compress_norm_rope_store
Each is timed cold (L2 flushed before every call) and under CUDA-graph replay (common.py's
Timer); ratios: ref / fused (> 1: the fused op faster) and fused / pair.
Conformance: the fused call's state rows and cache bytes equal the pair's bitwise; against the
reference: offline state rows bitwise, online state m bitwise and S, K within 1e-4 (contract
4), no cache byte outside the stored tokens differs, and the stored tokens within contract 4
as float64 arbitrates it (the float64 pooling of the step, `step64`): fp8_ds_mla through
benchmarks/peer_store_match.py's rules, fp4_indexer: every differing UE8M0 byte the one of
float64, codes of equal scales at most one step apart on at most 0.5 % of them.

    pip install --no-index --no-deps --target SITE PEER/wheels/*.whl        # once
    PYTHONPATH=PEER/stubs:SITE python3 -m benchmarks.peer_fused --peer-dir PEER --out DIR [--quick]
    python3 -m benchmarks.peer_fused --selftest [--out DIR]                 # CPU, no peer kit

Writes fused.json and fused.md under --out. Exit status: 0 all ran and conform, 1 nothing
measured (imports), 2 some case failed or did not conform, 3 the CUDA context was lost.
--selftest: tiny batches on the CPU, the reference replaced by a stand-in pair computed in
float64 from the planner's inputs (`StandIn`); measures nothing meaningful.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import torch

from benchmarks import common as C
from benchmarks import peer_common as PC

# (label, head_dim, ratio, store format, online): bench_fused.py's decode kernels
KERNELS = (("main512_c4", 512, 4, "fp8_ds_mla", False),
           ("indexer128_c4", 128, 4, "fp4_indexer", False),
           ("main512_c128", 512, 128, "fp8_ds_mla", False),
           ("online512_c128", 512, 128, "fp8_ds_mla", True))
BATCHES = (1, 8, 64, 256, 1024)
QUICK_BATCHES = (8, 64, 1024)
SELFTEST_BATCHES = (1, 3)
PATTERNS = ("bnd", "open")
ENGINES = ("fused", "pair", "ref")
SMALL_BATCH = 64      # issue targets split at this batch
CODE_SLACK = 0.005    # contract 4: codes one step apart on at most 0.5 % of them
STATE_TOL = 1e-4      # contract 4: online S and K


@dataclass(frozen=True)
class Case:
    label: str
    head_dim: int
    ratio: int
    store_format: str
    online: bool
    batch: int
    pattern: str

    @property
    def name(self) -> str:
        return f"{self.label}_{self.store_format}/dec_bs{self.batch}_{self.pattern}"


def case_list(quick: bool = False, selftest: bool = False) -> List[Case]:
    bs = SELFTEST_BATCHES if selftest else (QUICK_BATCHES if quick else BATCHES)
    return [Case(*k, b, p) for k in KERNELS for b in bs for p in PATTERNS]


def build_world(case: Case, device):
    seqs = C.decode_lengths(case.batch, case.pattern, case.ratio, C.case_seed(case.name))
    return C.make_world(ratio=case.ratio, head_dim=case.head_dim, reqs=[(s, 1) for s in seqs],
                        device=device, seed=C.case_seed(case.name), online=case.online)


# --------------------------------------------------------------------------------------
# Calling the engines the seed's way
# --------------------------------------------------------------------------------------
def seed_view(w, state: torch.Tensor) -> torch.Tensor:
    """The state buffer as `_forward_compress_all_in_one` views it."""
    if w.is_online:
        return state.view(-1, 1, 3 * w.head_dim)
    return state.view(-1, w.compress_ratio, w.kv_score_row_width)


def plan_of(api, w):
    D = api.CompressorDecodePlan
    if w.is_online:
        return D.generate_online(w.seq_lens, w.rid, w.req_to_token,
                                 state_slot_offset=w.state_slot_offset)
    return D.generate(w.compress_ratio, w.rid, w.req_to_token, w.full_to_state, w.seq_lens,
                      C.SWA_PAGE, w.ring, use_req_ring=w.use_req_ring)


def call_fn(engine: str, api, w, plan, fmt: str, state: torch.Tensor, cache: torch.Tensor
            ) -> Callable[[], Any]:
    """A zero-argument step of `engine` (fused / pair / ref) on its own state and cache."""
    hd, cr = w.head_dim, w.compress_ratio
    buf, ape = seed_view(w, state), w.ape.view(-1, hd)
    store = dict(norm_weight=w.norm_weight, norm_eps=C.NORM_EPS, freq_cis=w.freqs,
                 out_loc=w.out_loc, kvcache=cache, page_size=w.cache_page_size,
                 **C.store_flags(fmt))
    if engine == "fused":
        return lambda: api.compress_and_store(buf, w.kv_in, ape, plan, head_dim=hd,
                                              compress_ratio=cr, is_online=w.is_online, **store)

    def pair():
        kv = api.compress_forward(buf, w.kv_in, ape, plan, head_dim=hd, compress_ratio=cr,
                                  is_online=w.is_online)
        api.compress_norm_rope_store(kv, plan, **store)

    return pair


def dsv4_api() -> SimpleNamespace:
    import dsv4_ops

    return SimpleNamespace(name="dsv4_ops", **{n: getattr(dsv4_ops, n) for n in (
        "compress_and_store", "compress_forward", "compress_norm_rope_store",
        "CompressorDecodePlan")})


def sglang_api() -> SimpleNamespace:
    import importlib

    m = importlib.import_module(PC.REF_PKG + ".compress")
    kvl = importlib.import_module(PC.REF_PKG + ".kv_layout")
    return SimpleNamespace(name="sglang", module=m, KVLayout=kvl.KVLayout,
                           compress_forward=m.compress_forward,
                           compress_norm_rope_store=m.compress_norm_rope_store,
                           CompressorDecodePlan=m.CompressorDecodePlan)


def sglang_builders(api, cases: List[Case]) -> List[Tuple[str, Callable[[], Any]]]:
    """Zero-argument builders of the reference's JIT modules the cases need (the cached
    factories its entry points call)."""
    m, f32 = api.module, torch.float32
    out = {"plan": lambda: m._jit_compress_plan_module()}
    for c in cases:
        if c.online:
            out["online"] = lambda: m._jit_compress_128_online_module(512, f32)
        else:
            out[f"c{c.ratio}_hd{c.head_dim}"] = (lambda c=c: m._jit_compress_module(
                c.head_dim, f32, f32, f32, c.ratio))
        ps = C.FULL_PAGE // c.ratio
        out[f"store_hd{c.head_dim}_ps{ps}"] = (lambda c=c, ps=ps: m._jit_compress_norm_rope_module(
            f32, c.head_dim, 64, ps, False, api.KVLayout.V4, False))
    return list(out.items())


# --------------------------------------------------------------------------------------
# float64: one decode step from the planner's inputs (arbitration, and the selftest's pair)
# --------------------------------------------------------------------------------------
def step64(w, state: torch.Tensor, seq: torch.Tensor, rid: torch.Tensor,
           ) -> Tuple[torch.Tensor, Dict[int, torch.Tensor]]:
    """(pooled float64 [B, hd], zero where no window closes; {slot: new state row}) of one
    decode step on the CPU `state` (contract 3.4 / 3.5 with the pooling of
    dsv4_ops.testing.reference)."""
    from dsv4_ops.testing import reference as R

    hd, cr, comp = w.head_dim, w.compress_ratio, w.compressor
    x, ape = w.kv_in.cpu().double(), w.ape.cpu().double().reshape(-1, hd)
    r2t, f2s = w.req_to_token_cpu, w.full_to_state_cpu
    pooled = torch.zeros(len(seq), hd, dtype=torch.float64)
    rows: Dict[int, torch.Tensor] = {}

    def slot(r, p):
        return R.state_slot(comp.addressing, r, p, compress_ratio=cr, ring_size=w.ring,
                            swa_page_size=w.swa_page_size, req_to_token=r2t,
                            full_to_state=f2s, state_slot_offset=w.state_slot_offset)

    for b, (s, r) in enumerate(zip(seq.tolist(), rid.tolist())):
        if w.is_online:
            at, q = slot(r, s - 1), (s - 1) % 128
            z, kv = x[b, hd:] + ape[q], x[b, :hd]
            if q == 0:
                m, S, K = z, torch.ones(hd, dtype=torch.float64), kv
            else:
                m0, S0, K0 = state[at].double().view(3, hd)
                m = torch.maximum(m0, z)
                a, e = S0 * torch.exp(m0 - m), torch.exp(z - m)
                S, K = a + e, (K0 * a + kv * e) / (a + e)
            if s % 128 == 0:
                pooled[b] = K
            else:
                rows[at] = torch.cat([m, S, K])
            continue
        rows[slot(r, s - 1)] = x[b]
        if s % cr:
            continue
        first = max(0, s - 2 * cr) if cr == 4 else s - cr
        window = torch.stack([state[slot(r, p)].double() for p in range(first, s - 1)] + [x[b]])
        pooled[b] = R.compressed_tokens(window, ape, cr, hd)[-1]
    return pooled, rows


class StandIn:
    """The reference pair for --selftest, in float64 from the planner's inputs: its plan is
    those inputs, its compress_forward `step64`, its store dsv4_ops.testing.reference.store."""
    name = "stand-in"

    def __init__(self, world_of: Callable[[], Any]):
        self._world = world_of

    @property
    def CompressorDecodePlan(self):
        def generate(ratio, rid, r2t, f2s, seq, swa_page_size, ring, use_req_ring=False):
            return SimpleNamespace(compress_ratio=ratio, seq=seq.cpu(), rid=rid.cpu())

        def generate_online(seq, rid, r2t, state_slot_offset=0):
            return SimpleNamespace(compress_ratio=128, seq=seq.cpu(), rid=rid.cpu())

        return SimpleNamespace(generate=generate, generate_online=generate_online)

    def compress_forward(self, buf, kv_in, ape, plan, *, head_dim, compress_ratio,
                         is_online=False):
        w = self._world()
        state = buf.view(buf.shape[0] * buf.shape[1], -1)
        pooled, rows = step64(w, state, plan.seq, plan.rid)
        for at, row in rows.items():
            state[at] = row.to(state.dtype)
        return pooled.to(kv_in.dtype)

    def compress_norm_rope_store(self, kv, plan, *, norm_weight, norm_eps, freq_cis, out_loc,
                                 kvcache, page_size, use_fp4=False, bf16_store=False):
        from dsv4_ops.compressor import store_format_of
        from dsv4_ops.testing import reference as R

        r = plan.compress_ratio
        close = (plan.seq % r == 0).nonzero().flatten()
        R.store(kvcache, kv[close].double(), plan.seq[close] - r, out_loc.cpu()[close],
                norm_weight, norm_eps, freq_cis,
                store_format_of(kv.shape[-1], use_fp4, bf16_store), page_size)


# --------------------------------------------------------------------------------------
# Conformance
# --------------------------------------------------------------------------------------
def stored(w, fmt: str):
    """(batch rows, RoPE positions, data byte index [n, data], scale byte index [n, scales])
    of the tokens the step stores, over the flattened cache."""
    import dsv4_ops

    f = dsv4_ops.STORE_FORMATS[fmt]
    seq, ps = w.seq_lens_cpu, w.cache_page_size
    rows = (seq % w.compress_ratio == 0).nonzero().flatten()
    loc = w.out_loc_cpu[rows]
    keep = loc >= 0
    rows, loc = rows[keep], loc[keep]
    page_bytes = w.kvcache(fmt).shape[1]
    base = (loc // ps) * page_bytes
    d = base[:, None] + (loc % ps)[:, None] * f.data_bytes + torch.arange(f.data_bytes)
    s = (base[:, None] + ps * f.data_bytes + (loc % ps)[:, None] * f.scale_stride
         + torch.arange(f.scale_bytes))
    return rows, seq[rows] - w.compress_ratio, d, s


def _signed_e2m1(nib: np.ndarray) -> np.ndarray:
    idx = (nib & 7).astype(np.int64)
    return np.where(nib & 8, -idx, idx)


def fp4_verdict(ours: Dict[str, np.ndarray], ref: Dict[str, np.ndarray],
                exact_scales: np.ndarray) -> Dict[str, Any]:
    """fp4_indexer tokens ({'data' [n, 64], 'scales' [n, 4]}) against the reference's: a
    differing UE8M0 byte must be float64's; codes of equal scales one step apart at most, on
    at most CODE_SLACK of them."""
    def nibbles(d):
        return np.stack([d & 15, d >> 4], axis=-1).reshape(d.shape[0], 128)

    a, b = _signed_e2m1(nibbles(ours["data"])), _signed_e2m1(nibbles(ref["data"]))
    sd = ours["scales"] != ref["scales"]
    same = np.repeat(~sd, 32, axis=1)
    steps = np.abs(a - b)[same]
    res = {"tokens": int(a.shape[0]), "scale_bytes": int(sd.size), "scale_diff": int(sd.sum()),
           "codes": int(a.size), "code_diff": int((a != b).sum()),
           "code_diff_same_scale": int((steps != 0).sum()),
           "code_max_steps_same_scale": int(steps.max()) if steps.size else 0,
           "scale_equal_exact": int((ours["scales"][sd] == exact_scales[sd]).sum())}
    exact = res["scale_diff"] == 0 and res["code_diff"] == 0
    scales_ok = res["scale_equal_exact"] == res["scale_diff"]
    codes_ok = (res["code_max_steps_same_scale"] <= 1
                and res["code_diff_same_scale"] <= CODE_SLACK * res["codes"])
    res["verdict"] = {"bytes_equal": exact, "scales_ok": scales_ok, "codes_ok": codes_ok,
                      "ok": exact or (scales_ok and codes_ok)}
    return res


def tokens_verdict(w, fmt: str, pooled: torch.Tensor, pos: torch.Tensor,
                   ours: Dict[str, np.ndarray], ref: Dict[str, np.ndarray]) -> Dict[str, Any]:
    """The stored tokens of both engines within contract 4, float64 (`pooled`) arbitrating."""
    if not pos.numel():
        return {"tokens": 0, "verdict": {"bytes_equal": True, "ok": True}}
    if fmt == "fp8_ds_mla":
        from benchmarks import peer_store_match as PSM

        freqs = w.freqs_real.float().cpu().numpy()
        res = PSM.compare_rows(pooled.numpy(), pos.numpy(), freqs,
                               w.norm_weight.float().cpu().numpy(), C.NORM_EPS,
                               {"data": ours["data"], "scales": ours["scales"][:, :7]},
                               {"data": ref["data"], "scales": ref["scales"][:, :7]})
        res["tokens"] = int(pos.numel())
        return res
    from dsv4_ops.testing import reference as R

    y = R.norm_rope(pooled, pos, w.norm_weight.cpu(), C.NORM_EPS, w.freqs.cpu())
    _, exact = R.encode(y, fmt)
    return fp4_verdict(ours, ref, exact.numpy())


def state_verdict(w, ref: torch.Tensor, ours: torch.Tensor) -> Dict[str, Any]:
    a, b = ref.cpu().reshape(ref.shape[0], -1), ours.cpu().reshape(ours.shape[0], -1)
    if not w.is_online:
        return {"state_equal": bool(torch.equal(a, b)), "ok": bool(torch.equal(a, b))}
    hd = w.head_dim
    m_ok = bool(torch.equal(a[:, :hd].view(torch.int32), b[:, :hd].view(torch.int32)))
    d = (a[:, hd:].double() - b[:, hd:].double()).abs() / a[:, hd:].double().abs().clamp(min=1)
    rel = float(d.max()) if d.numel() else 0.0
    return {"m_bitwise": m_ok, "max_rel_sk": rel, "ok": m_ok and rel <= STATE_TOL}


def conformance(w, fmt: str, state0: torch.Tensor, plan_inputs, outs) -> Dict[str, Any]:
    """outs: {engine: (state, cache)} after one call each from state0 and a zeroed cache."""
    (fs, fc), (ps_, pc), (rs, rc) = (outs[e] for e in ENGINES)
    res: Dict[str, Any] = {"pair_state_equal": bool(torch.equal(fs, ps_)),
                           "pair_cache_equal": bool(torch.equal(fc, pc))}
    res["pair_ok"] = res["pair_state_equal"] and res["pair_cache_equal"]
    res["ref_state"] = state_verdict(w, rs, fs)
    rows, pos, d, s = stored(w, fmt)
    fo, fr = fc.cpu().reshape(-1), rc.cpu().reshape(-1)
    outside = torch.ones_like(fo, dtype=torch.bool)
    outside[d.flatten()] = False
    outside[s.flatten()] = False
    res["ref_outside_differ"] = int((fo[outside] != fr[outside]).sum())
    empty = [e for e, (_, c) in outs.items()
             if rows.numel() and int((c.cpu().reshape(-1)[d] != 0).any(1).sum()) != rows.numel()]
    res["tokens_without_data"] = empty
    pooled, _ = step64(w, state0, *plan_inputs)
    tok = tokens_verdict(w, fmt, pooled[rows], pos,
                         {"data": fo[d].numpy(), "scales": fo[s].numpy()},
                         {"data": fr[d].numpy(), "scales": fr[s].numpy()})
    res["ref_tokens"] = {k: v for k, v in tok.items()
                         if k in ("tokens", "scale_diff", "code_diff", "rope_diff",
                                  "rope_max_ulps", "code_diff_same_scale", "verdict")}
    res["ref_ok"] = bool(res["ref_state"]["ok"] and res["ref_outside_differ"] == 0
                         and not empty and tok["verdict"]["ok"])
    res["ok"] = res["pair_ok"] and res["ref_ok"]
    return res


# --------------------------------------------------------------------------------------
# One case, the rows, the summary
# --------------------------------------------------------------------------------------
def run_case(case: Case, apis: Dict[str, Any], timer: C.Timer, s: PC.Settings, device,
             hold: Dict[str, Any]) -> Dict[str, Any]:
    w = build_world(case, device)
    hold["world"] = w
    rec: Dict[str, Any] = {"case": case.name, "kernel": case.label, "store_format":
                           case.store_format, "batch": case.batch, "pattern": case.pattern,
                           "closing": int((w.seq_lens_cpu % case.ratio == 0).sum())}
    state0 = w.state.clone()
    plans = {name: plan_of(api, w) for name, api in apis.items()}

    def start(engine):
        api = "sglang" if engine == "ref" else "dsv4"
        state, cache = state0.clone(), w.kvcache(case.store_format, pages=w.num_pages)
        return (state, cache), call_fn(engine, apis[api], w, plans[api], case.store_format,
                                       state, cache)

    outs, fns = PC.first_calls({e: (lambda e=e: start(e)) for e in ENGINES}, timer, rec)
    if len(fns) == len(ENGINES):
        rec["conformance"] = conformance(w, case.store_format, state0.cpu(),
                                         (w.seq_lens_cpu, w.rid_cpu), outs)
    del outs  # the calls keep their buffers: timing them repeats the step on them
    PC.time_calls(fns, timer, s, False, rec)
    return rec


def _med(rec, e, key) -> Optional[float]:
    v = (rec.get(e) or {}).get(key)
    return v["median"] if v else None


def _div(a, b):
    return a / b if a and b else None


def joined_row(rec: Dict[str, Any]) -> Dict[str, Any]:
    row = {k: rec.get(k) for k in ("case", "kernel", "store_format", "batch", "pattern")}
    for key, suffix in (("cold_us", "us"), ("graph_us", "graph_us")):
        t = {e: _med(rec, e, key) for e in ENGINES}
        row.update({f"{e}_{suffix}": t[e] for e in ENGINES})
        tag = "" if key == "cold_us" else "_graph"
        row[f"ref_over_fused{tag}"] = _div(t["ref"], t["fused"])
        row[f"fused_over_pair{tag}"] = _div(t["fused"], t["pair"])
    conf = rec.get("conformance")
    row["pair_conform"] = None if conf is None else ("ok" if conf["pair_ok"] else "FAIL")
    row["ref_conform"] = None if conf is None else ("ok" if conf["ref_ok"] else "FAIL")
    tok = (conf or {}).get("ref_tokens", {})
    row["ref_bytes_equal"] = tok["verdict"]["bytes_equal"] if tok.get("tokens") else None
    notes = [f"{e}: {rec[e + '_error']}" for e in ENGINES if rec.get(e + "_error")]
    notes += [f"{e} {rec[e]['graph_error']}" for e in ENGINES
              if (rec.get(e) or {}).get("graph_error")]
    if conf and not conf["ok"]:
        notes.append(json.dumps(conf, default=str))
    row["note"] = "; ".join(notes)
    return row


def summarize(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
    def pick(key, small=None):
        return [r[key] for r in rows if r.get(key)
                and (small is None or (r["batch"] <= SMALL_BATCH) == small)]

    out: Dict[str, Any] = {"cases": len(rows)}
    for tag in ("", "_graph"):
        rf, fp = f"ref_over_fused{tag}", f"fused_over_pair{tag}"
        for part, small in (("_le64", True), ("_gt64", False)):
            r, f = pick(rf, small), pick(fp, small)
            out[f"min_ref_over_fused{tag}{part}"] = min(r) if r else None
            out[f"max_fused_over_pair{tag}{part}"] = max(f) if f else None
        r, f = pick(rf), pick(fp)
        out[f"median_ref_over_fused{tag}"] = statistics.median(r) if r else None
        out[f"median_fused_over_pair{tag}"] = statistics.median(f) if f else None
    for k in ("pair_conform", "ref_conform"):
        out[k] = (f"{sum(r[k] == 'ok' for r in rows)}/{sum(r[k] is not None for r in rows)} ok")
    out["ref_bytes_equal"] = (f"{sum(bool(r['ref_bytes_equal']) for r in rows)} of "
                              f"{sum(r['ref_bytes_equal'] is not None for r in rows)}")
    out["errors"] = sum(bool(r["note"]) for r in rows)
    return out


def summary_line(sm: Dict[str, Any]) -> str:
    def _c(x, nd):
        return "-" if x is None else f"{x:.{nd}f}"

    return (f"SUMMARY ref/fused cold min {_c(sm['min_ref_over_fused_le64'], 2)} (B<=64) / "
            f"{_c(sm['min_ref_over_fused_gt64'], 2)} (B>64), graph "
            f"{_c(sm['min_ref_over_fused_graph_le64'], 2)} / "
            f"{_c(sm['min_ref_over_fused_graph_gt64'], 2)}; fused/pair cold max "
            f"{_c(sm['max_fused_over_pair_le64'], 2)} / {_c(sm['max_fused_over_pair_gt64'], 2)}, "
            f"graph {_c(sm['max_fused_over_pair_graph_le64'], 2)} / "
            f"{_c(sm['max_fused_over_pair_graph_gt64'], 2)}; conform pair {sm['pair_conform']}, "
            f"ref {sm['ref_conform']} (bytes equal in {sm['ref_bytes_equal']} storing cases); cases "
            f"with a note "
            f"{sm['errors']}")


MD_COLS = (("case", None), ("fused_us", 1), ("pair_us", 1), ("ref_us", 1),
           ("ref_over_fused", 2), ("fused_over_pair", 2), ("fused_graph_us", 1),
           ("pair_graph_us", 1), ("ref_graph_us", 1), ("ref_over_fused_graph", 2),
           ("fused_over_pair_graph", 2), ("pair_conform", None), ("ref_conform", None),
           ("note", None))
TEXT_COLS = (("case", None, 40), ("fused_us", 1, 8), ("pair_us", 1, 8), ("ref_us", 1, 8),
             ("ref_over_fused", 2, 6), ("fused_over_pair", 2, 6), ("fused_graph_us", 1, 8),
             ("pair_graph_us", 1, 8), ("ref_graph_us", 1, 8), ("ref_over_fused_graph", 2, 6),
             ("fused_over_pair_graph", 2, 6), ("pair_conform", None, 4),
             ("ref_conform", None, 4))
HEADER = ("| case | fused us | pair us | ref us | ref / fused | fused / pair | fused graph us | "
          "pair graph us | ref graph us | ref / fused graph | fused / pair graph | = pair | "
          "~ ref | note |")


def markdown(rows, summary, info, ceiling) -> List[str]:
    lines = ["# compress_and_store vs the unfused pairs (dsv4_ops and the reference engine)", "",
             PC.env_line(info, ceiling), "",
             "Medians in microseconds: cold = L2 flushed before each call; graph = per call in a "
             "CUDA-graph replay. fused = dsv4_ops.compress_and_store, pair = dsv4_ops "
             "compress_forward + compress_norm_rope_store, ref = the reference engine's pair. "
             "= pair: state rows and cache bytes bitwise the pair's; ~ ref: within contract 4 of "
             "the reference's (float64 arbitrating).", "", summary_line(summary), "", HEADER,
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    lines += [PC.md_row(r, MD_COLS) for r in rows]
    return lines


def text_row(r) -> str:
    return PC.text_line(r, TEXT_COLS)


TEXT_HEADER = (f"{'case':<40} {'fused':>8} {'pair':>8} {'ref':>8} {'r/f':>6} {'f/p':>6} "
               f"{'fused_g':>8} {'pair_g':>8} {'ref_g':>8} {'r/f_g':>6} {'f/p_g':>6} =pr  ~ref")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    PC.add_args(ap, "peer_fused_out", "B 8, 64 and 1024")
    PC.add_run_args(ap, "CPU: tiny batches, the reference pair replaced by the float64 stand-in")
    args, t_start, info, cases = PC.parse(ap, argv, lambda a: case_list(a.quick, a.selftest))
    hold: Dict[str, Any] = {}
    run = PC.engines("peer_fused", args, info,
                     lambda: {"sglang": StandIn(lambda: hold["world"]), "dsv4": dsv4_api()},
                     "float64 stand-in (selftest)", sglang_api, dsv4_api,
                     lambda api: sglang_builders(api, cases))
    if run is None:
        return 1
    apis, device, s = run
    timer, ceiling = PC.begin(info, device, cases, TEXT_HEADER)

    def one(case):
        try:
            with torch.inference_mode():
                return run_case(case, apis, timer, s, device, hold)
        finally:
            hold.clear()

    recs, rows, skipped, status = PC.run_all(
        "peer_fused", cases, one,
        lambda c, msg: {"case": c.name, "kernel": c.label, "store_format": c.store_format,
                        "batch": c.batch, "pattern": c.pattern, "fused_error": msg},
        joined_row, text_row, timer, info,
        deadline=t_start + args.budget_s if args.budget_s else None)
    summary = summarize(rows)
    summary.update(run_seconds=round(time.monotonic() - t_start, 1), skipped_for_time=skipped)
    payload = {"env": info, "ceiling": ceiling, "args": vars(args), "summary": summary,
               "joined": rows, "records": recs}
    PC.write_results(args.out, "fused", payload, markdown(rows, summary, info, ceiling))
    log(summary_line(summary))
    log(f"wrote {args.out}/fused.json and fused.md (exit {status})")
    return status


log = PC.log

if __name__ == "__main__":
    sys.exit(main())
