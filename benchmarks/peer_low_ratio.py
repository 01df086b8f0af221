#!/usr/bin/env python3
"""The V4.1 ops (ratio 1 / ratio 2 compressors, kv_store, index-K) side by side with the
reference engine's kernels (sglang 0.5.23, loaded through the peer kit), in one process.

Every case builds one set of inputs and runs both engines on them through the same
drop-in signatures (docs/contract.md V4.1 4.3 = the reference's functions): each engine gets
its own copy of the state ring and a zeroed cache and latent, is checked against the other
(conformance below), then timed cold (L2 flushed before every call) and under CUDA-graph
replay with benchmarks/common.py's Timer.

    pip install --no-index --no-deps --target SITE PEER/wheels/*.whl        # once
    PYTHONPATH=PEER/stubs:SITE python3 -m benchmarks.peer_low_ratio --peer-dir PEER --out DIR [--quick]
    python3 -m benchmarks.peer_low_ratio --selftest [--out DIR]             # CPU, no peer kit

Cases (name = op/layout/pps{page_size}/shape):
  c2  ratio-2 decode, batch 1/8/64/256/1024 (mixed parity, ring 2); verify D = 2..6 with
      ring 8 at batch 8/64/256; prefill 8x4096 (prefixes of both parities: first partners
      from the ring) and 1x32768 (from position 0); c1 (ratio 1) the same decode batches
      and prefills; every layout (--quick: v41_fp4 and v4); page size 64 (--page-sizes).
  index_k  ratios 1 and 2 at the decode batches and prefills (its own 68-byte cache).
  kv_store fused_store_cache(type="flashmla") into v41 / v41_fp4 / v41_new with per-row
      freqs, and v4 without.
  cnrs compress_norm_rope_store(..., layout=v41 / v41_fp4 / v41_new) of ratio-4 decode rows
      (every request closing a window; each engine's own legacy decode plan, made outside
      the timed call), kv fp32, and bf16 at the largest batch.
Conformance: the latent equal or within 1 bf16 ulp on <= 0.1 % of the written elements; the
cache bytes equal everywhere except the token slots of rows whose latents differ; the state
ring bitwise equal; kv_store caches equal; index-K and cnrs: <= 0.1 % of the stored token
slots differ, no byte outside them.
Floor: the case's minimum bytes (read + written, `case_bytes`) over the cold time of a
device copy moving as many bytes (read + write), timed the same way: % floor = copy time /
op time. Writes low_ratio.json and low_ratio.md under --out; ratio = reference / dsv4_ops
(> 1: dsv4_ops faster). Exit status: 0 all ran and conform, 1 nothing measured (imports),
2 some case failed or did not conform, 3 the CUDA context was lost.
--selftest: tiny cases on the CPU, dsv4_ops against a stand-in peer built from the
whole-sequence oracle (dsv4_ops.testing.reference_v41; its float64 pooling allows a
differing latent element 2 ulps, see OracleStandIn); measures nothing meaningful.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import types
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from benchmarks import common as C
from benchmarks import peer_common as PC
from benchmarks.peer_common import APIS, REF_PKG, Settings, log

HEAD_DIM = 512
INDEX_DIM = 128
ROPE_DIM = 64
INDEX_K_SLOT_BYTES = 68
LAYOUTS = ("v4", "v41", "v41_fp4", "uniform_fp8", "v41_new", "v41_fp4_new")
QUICK_LAYOUTS = ("v41_fp4", "v4")
KV_STORE_LAYOUTS = ("v41", "v41_fp4", "v41_new", "v4")   # the reference's fused store (v4: no RoPE)
DECODE_BS = (1, 8, 64, 256, 1024)
VERIFY_BS = (8, 64, 256)
VERIFY_D = (2, 3, 4, 5, 6)
VERIFY_RING = 8
DECODE_RING = 2
# (name, [(prefix, extend_len)])
PREFILLS = (("p8x4096", [(0, 4096), (1, 4096), (1000, 4096), (2049, 4096)] * 2),
            ("p1x32768", [(0, 32768)]))
DECODE_POS = (1024, 8192)
FULL_PAGE = 256
OP_FAMILY = {"c1": "c1", "c1_prefill": "c1", "c2": "c2", "c2_verify": "c2", "c2_prefill": "c2",
             "index_k": "index_k", "index_k_prefill": "index_k", "kv_store": "kv_store",
             "cnrs": "cnrs"}
CNRS_LAYOUTS = ("v41", "v41_fp4", "v41_new")   # compress_norm_rope_store(layout=...), ratio 4
CNRS_RATIO = 4
# --selftest: tiny shapes
SELFTEST_DECODE_BS = (1, 8)
SELFTEST_VERIFY = ((4, 3), (2, 6))
SELFTEST_PREFILLS = (("p3x40", [(0, 40), (1, 17), (6, 9)]),)
SELFTEST_POS = (16, 200)


# --------------------------------------------------------------------------------------
# Cases and their inputs
# --------------------------------------------------------------------------------------
@dataclass
class Case:
    """op: c1 | c2 | c2_verify | c2_prefill | c1_prefill | index_k | index_k_prefill | kv_store |
    cnrs (compress_norm_rope_store of ratio-4 decode rows, every one closing a window; kv
    fp32, bf16 where the shape ends in _bf16);
    layout (index_k: None), page_size, shape: bs (decode rows = requests), draft_len
    (verify), reqs [(prefix, extend_len)] (prefill), ratio (index_k)."""
    op: str
    layout: Optional[str]
    page_size: int
    shape: str
    bs: int = 0
    draft_len: int = 1
    reqs: Sequence[Tuple[int, int]] = ()
    ratio: int = 2
    pos_range: Tuple[int, int] = DECODE_POS

    @property
    def name(self) -> str:
        lay = self.layout if self.layout else f"r{self.ratio}"
        return f"{OP_FAMILY[self.op]}/{lay}/ps{self.page_size}/{self.shape}"

    @property
    def is_prefill(self) -> bool:
        return bool(self.reqs)

    @property
    def ring(self) -> int:
        return VERIFY_RING if self.op == "c2_verify" else DECODE_RING


def case_list(quick: bool = False, layouts: Optional[Sequence[str]] = None,
              page_sizes: Sequence[int] = (64,), selftest: bool = False) -> List[Case]:
    layouts = tuple(layouts or (QUICK_LAYOUTS if quick else LAYOUTS))
    if selftest:
        dec, ver, pre, pr = SELFTEST_DECODE_BS, SELFTEST_VERIFY, SELFTEST_PREFILLS, SELFTEST_POS
    else:
        dec = (8, 1024) if quick else DECODE_BS
        ver = ([(8, 3), (64, 6)] if quick
               else [(b, d) for d in VERIFY_D for b in VERIFY_BS])
        pre, pr = PREFILLS, DECODE_POS
    out: List[Case] = []
    for ps in page_sizes:
        for lay in layouts:
            for bs in dec:
                out.append(Case("c2", lay, ps, f"dec_bs{bs}", bs=bs, pos_range=pr))
            for bs, d in ver:
                out.append(Case("c2_verify", lay, ps, f"ver_b{bs}_d{d}", bs=bs, draft_len=d,
                                pos_range=pr))
            for name, reqs in pre:
                out.append(Case("c2_prefill", lay, ps, name, reqs=reqs))
            for bs in dec:
                out.append(Case("c1", lay, ps, f"dec_bs{bs}", bs=bs, pos_range=pr))
            for name, reqs in pre:
                out.append(Case("c1_prefill", lay, ps, name, reqs=reqs))
        for ratio in (1, 2):
            for bs in dec:
                out.append(Case("index_k", None, ps, f"dec_bs{bs}", bs=bs, ratio=ratio,
                                pos_range=pr))
            for name, reqs in pre:
                out.append(Case("index_k_prefill", None, ps, name, reqs=reqs, ratio=ratio))
        for lay in KV_STORE_LAYOUTS:
            if lay not in layouts:
                continue
            for bs in dec:
                out.append(Case("kv_store", lay, ps, f"dec_bs{bs}", bs=bs, pos_range=pr))
            name, reqs = pre[0]
            out.append(Case("kv_store", lay, ps, name, reqs=reqs))
        for lay in CNRS_LAYOUTS:
            if lay not in layouts:
                continue
            for bs in dec:
                out.append(Case("cnrs", lay, ps, f"dec_bs{bs}", bs=bs, pos_range=pr))
            out.append(Case("cnrs", lay, ps, f"dec_bs{dec[-1]}_bf16", bs=dec[-1], pos_range=pr))
    return out


def _rows_layout(case: Case, gen: torch.Generator):
    """(positions, rid, raw_out_loc, extend_start, extend_lens, num_req_slots) as int64 CPU
    tensors. Decode: one row per request, random positions in pos_range, half of them odd
    (batch 1: odd), one FULL page per request (verify: two, for the D consecutive
    positions), so raw_out_loc's parity follows the position and page 0 stays unused.
    Prefill: each request's rows at positions prefix .. prefix+len-1, a region of whole FULL
    pages per request."""
    lo, hi = case.pos_range
    if not case.reqs:
        b, d = case.bs, case.draft_len
        slots = b + 8
        rid = torch.randperm(slots, generator=gen)[:b]
        pos0 = torch.randint(lo, hi, (b,), generator=gen) // 2 * 2
        odd = (torch.arange(b) % 2 == 0).to(torch.int64)
        pos0 = pos0 + odd[torch.randperm(b, generator=gen)]
        region = FULL_PAGE * (2 if d > 1 else 1)
        base = (1 + torch.randperm(b, generator=gen)) * region
        j = torch.arange(d)
        pos = (pos0[:, None] + j).reshape(-1)
        raw = (base[:, None] + (pos0[:, None] % FULL_PAGE) + j).reshape(-1)
        rid = rid[:, None].expand(b, d).reshape(-1).contiguous()
        return pos, rid, raw, None, None, slots
    lens = [e for _, e in case.reqs]
    slots = len(case.reqs) + 8
    rids = torch.randperm(slots, generator=gen)[:len(case.reqs)]
    region = -(-max(p + e for p, e in case.reqs) // FULL_PAGE) * FULL_PAGE
    order = torch.randperm(len(case.reqs), generator=gen)
    pos, rid, raw = [], [], []
    for i, (p, e) in enumerate(case.reqs):
        q = torch.arange(p, p + e)
        pos.append(q)
        rid.append(torch.full((e,), int(rids[i])))
        raw.append((1 + int(order[i])) * region + q)
    starts = torch.tensor([0] + lens[:-1]).cumsum(0)
    return (torch.cat(pos), torch.cat(rid), torch.cat(raw), starts,
            torch.tensor(lens), slots)


def _rope_rows(max_pos: int) -> torch.Tensor:
    from dsv4_ops.testing import worlds

    return torch.view_as_real(worlds.rope_table(max_pos)).flatten(-2).contiguous()


def build_inputs(case: Case, device, seed: Optional[int] = None) -> Dict[str, Any]:
    """Every tensor of one case on `device` (state, caches and latents are the engine-
    independent starting values; `fresh_outputs` copies them per engine)."""
    import dsv4_ops.layout as L

    gen = torch.Generator().manual_seed(C.case_seed(case.name) if seed is None else seed)
    pos, rid, raw, starts, lens, slots = _rows_layout(case, gen)
    n = pos.numel()
    inp: Dict[str, Any] = {"case": case, "n": n}
    max_pos = int(pos.max()) + 2
    freqs = _rope_rows(max_pos)
    ps = case.page_size
    if case.op == "cnrs":
        from dsv4_ops.testing import worlds

        lay = L.KVLayout.parse(case.layout)
        b = case.bs
        seq = (pos // CNRS_RATIO + 1) * CNRS_RATIO          # every request closes a window
        cpp = FULL_PAGE // CNRS_RATIO                         # compressed slots per FULL page
        loc = (raw // FULL_PAGE) * cpp + (seq // CNRS_RATIO - 1) % cpp
        dt = torch.bfloat16 if case.shape.endswith("_bf16") else torch.float32
        inp.update(kv=torch.randn(b, HEAD_DIM, generator=gen).to(dt), seq_lens=seq, req=rid,
                   positions=seq - CNRS_RATIO,
                   out_loc=loc, freqs=worlds.rope_table(int(seq.max()) + 1),
                   norm_weight=1 + 0.1 * torch.randn(HEAD_DIM, generator=gen))
        inp["cache0"] = torch.zeros(int(loc.max()) // ps + 1, lay.page_bytes(ps),
                                    dtype=torch.uint8)
    elif case.op in ("index_k", "index_k_prefill"):
        r = case.ratio
        loc = torch.where((pos + 1) % r == 0, raw // r, torch.full_like(raw, -1))
        inp.update(k=torch.randn(n, INDEX_DIM, generator=gen).to(torch.bfloat16),
                   norm_weight=(1 + 0.1 * torch.randn(INDEX_DIM, generator=gen)).to(torch.bfloat16),
                   loc=loc, positions=pos, freqs=freqs)
        pages = int(loc.max()) // ps + 1
        inp["cache0"] = torch.zeros(pages, INDEX_K_SLOT_BYTES * ps, dtype=torch.uint8)
    elif case.op == "kv_store":
        lay = L.KVLayout.parse(case.layout)
        x = torch.randn(n, HEAD_DIM, generator=gen).to(torch.bfloat16)
        inp.update(x=x, loc=raw, positions=pos,
                   freqs_rows=None if lay is L.KVLayout.V4 else freqs[pos].contiguous())
        inp["cache0"] = torch.zeros(int(raw.max()) // ps + 1, lay.page_bytes(ps),
                                    dtype=torch.uint8)
    else:
        lay = L.KVLayout.parse(case.layout)
        ratio = 1 if case.op.startswith("c1") else 2
        slot = raw >> (ratio - 1)
        inp.update(positions=pos, req=rid, raw_out_loc=raw, freqs=freqs,
                   norm_weight=(1 + 0.1 * torch.randn(HEAD_DIM, generator=gen)).to(torch.bfloat16),
                   slot=slot)
        if ratio == 1:
            inp["kv"] = torch.randn(n, HEAD_DIM, generator=gen).to(torch.bfloat16)
        else:
            kv_score = torch.randn(n, 2 * HEAD_DIM, generator=gen)
            kv_score[:, HEAD_DIM:] *= 2.0  # a score spread that keeps the softmax away from flat
            rows = -(-(slots * case.ring + case.ring + 1) // 2) * 2  # contract V4.1 2.1
            state = torch.randn(rows, 2 * HEAD_DIM, generator=gen)
            state[:, HEAD_DIM:] *= 2.0
            inp.update(kv_score=kv_score, state0=state)
        if starts is not None:
            inp.update(extend_start_loc=starts.to(torch.int32),
                       extend_seq_lens=lens.to(torch.int32))
        inp["cache0"] = torch.zeros(int(slot.max()) // ps + 1, lay.page_bytes(ps),
                                    dtype=torch.uint8)
        inp["latent0"] = torch.zeros(n, HEAD_DIM, dtype=torch.bfloat16)
    for k, v in list(inp.items()):
        if isinstance(v, torch.Tensor):
            inp[k] = v.to(device)
    return inp


def fresh_outputs(inp: Dict[str, Any]) -> Dict[str, torch.Tensor]:
    """One engine's mutable tensors: the state ring, the cache and the latent, from the
    case's starting values."""
    return {k: inp[k + "0"].clone() for k in ("state", "cache", "latent") if k + "0" in inp}


def written_rows(inp: Dict[str, Any]) -> torch.Tensor:
    """bool [n]: the rows whose latent an engine writes (c1: all; c2: odd positions with
    raw_out_loc > 0)."""
    case = inp["case"]
    if case.op.startswith("c1"):
        return torch.ones(inp["n"], dtype=torch.bool, device=inp["positions"].device)
    return (inp["positions"] % 2 == 1) & (inp["raw_out_loc"] > 0)


# --------------------------------------------------------------------------------------
# Calling one engine
# --------------------------------------------------------------------------------------
def call_fn(api, inp: Dict[str, Any], outs: Dict[str, torch.Tensor]) -> Callable[[], Any]:
    """A zero-argument call of the case's op through `api` (the reference's signatures) on
    the engine's own outputs `outs`."""
    case, ps = inp["case"], inp["case"].page_size
    if case.op in ("c1", "c1_prefill"):
        f = _need(api, "c1_decode_norm_rope_store")
        return lambda: f(inp["kv"], inp["norm_weight"], inp["positions"], inp["raw_out_loc"],
                         C.NORM_EPS, inp["freqs"], outs["cache"], page_size=ps,
                         layout=case.layout, out=outs["latent"])
    if case.op in ("c2", "c2_verify"):
        f = _need(api, "c2_decode_norm_rope_store")
        return lambda: f(inp["kv_score"], outs["state"], inp["norm_weight"], inp["positions"],
                         inp["req"], inp["raw_out_loc"], C.NORM_EPS, inp["freqs"],
                         outs["cache"], page_size=ps, ring_size=case.ring,
                         draft_len=case.draft_len, layout=case.layout, out=outs["latent"])
    if case.op == "c2_prefill":
        f = _need(api, "c2_prefill_norm_rope_store")
        return lambda: f(inp["kv_score"], outs["state"], inp["norm_weight"], inp["positions"],
                         inp["req"], inp["raw_out_loc"], C.NORM_EPS, inp["freqs"],
                         outs["cache"], inp["extend_start_loc"], inp["extend_seq_lens"],
                         page_size=ps, ring_size=case.ring, layout=case.layout,
                         out=outs["latent"])
    if case.op in ("index_k", "index_k_prefill"):
        f = _need(api, "index_k_norm_rope_pack_store")
        return lambda: f(inp["k"], inp["norm_weight"], C.NORM_EPS, inp["freqs"],
                         inp["positions"], inp["loc"], outs["cache"], ratio=case.ratio)
    if case.op == "cnrs":
        f = _need(api, "compress_norm_rope_store")
        plan = _need(api, "CompressorDecodePlan").generate_legacy(CNRS_RATIO, inp["req"],
                                                                  inp["seq_lens"])
        return lambda: f(inp["kv"], plan, norm_weight=inp["norm_weight"], norm_eps=C.NORM_EPS,
                         freq_cis=inp["freqs"], out_loc=inp["out_loc"], kvcache=outs["cache"],
                         page_size=ps, layout=case.layout)
    if case.op == "kv_store":
        f = _need(api, "fused_store_cache")
        return lambda: f(inp["x"], outs["cache"], inp["loc"], page_size=ps, type="flashmla",
                         layout=case.layout, freqs_cis=inp["freqs_rows"])
    raise ValueError(f"peer_low_ratio: unknown op {case.op!r}")


def _need(api, name: str):
    f = getattr(api, name, None)
    if f is None:
        raise RuntimeError(f"{api.name} has no {name}")
    return f


def dsv4_api() -> SimpleNamespace:
    import dsv4_ops

    names = ("c1_decode_norm_rope_store", "c2_decode_norm_rope_store",
             "c2_prefill_norm_rope_store", "fused_store_cache", "index_k_norm_rope_pack_store",
             "compress_norm_rope_store", "CompressorDecodePlan")
    return SimpleNamespace(name="dsv4_ops", **{n: getattr(dsv4_ops, n, None) for n in names})


def sglang_api() -> SimpleNamespace:
    """The reference's V4.1 functions through the stub packages; `.fp4_indexer` (imported by
    fp4_indexer_rope for its slot size only, and pulling in modules the stubs lack) is a
    one-constant stand-in."""
    import importlib

    shim = types.ModuleType(REF_PKG + ".fp4_indexer")
    shim.INDEX_K_SLOT_BYTES = INDEX_K_SLOT_BYTES
    sys.modules.setdefault(REF_PKG + ".fp4_indexer", shim)
    lr = importlib.import_module(REF_PKG + ".low_ratio_compress")
    attn = importlib.import_module(REF_PKG + ".attn")
    fir = importlib.import_module(REF_PKG + ".fp4_indexer_rope")
    kvl = importlib.import_module(REF_PKG + ".kv_layout")
    comp = importlib.import_module(REF_PKG + ".compress")
    return SimpleNamespace(
        name="sglang", modules=SimpleNamespace(lr=lr, attn=attn, fir=fir, KVLayout=kvl.KVLayout),
        c1_decode_norm_rope_store=lr.c1_decode_norm_rope_store,
        c2_decode_norm_rope_store=lr.c2_decode_norm_rope_store,
        c2_prefill_norm_rope_store=lr.c2_prefill_norm_rope_store,
        fused_store_cache=attn.fused_store_cache,
        index_k_norm_rope_pack_store=fir.index_k_norm_rope_pack_store,
        compress_norm_rope_store=comp.compress_norm_rope_store,
        CompressorDecodePlan=comp.CompressorDecodePlan)


def sglang_builders(api, cases: Sequence[Case]) -> List[Tuple[str, Callable[[], Any]]]:
    """Zero-argument builders of the reference's JIT modules that `cases` need (the same
    cached factories its entry points call)."""
    m = api.modules
    seen, out = set(), []

    def add(key, fn):
        if key not in seen:
            seen.add(key)
            out.append((str(key), fn))

    for c in cases:
        ps = c.page_size
        if c.op.startswith("c1"):
            lay = m.KVLayout.parse(c.layout)
            add(("c1", ps, c.layout), lambda ps=ps, lay=lay: m.lr._jit_c1_module(HEAD_DIM, ROPE_DIM, ps, lay))
        elif c.op.startswith("c2"):
            lay = m.KVLayout.parse(c.layout)
            add(("c2", ps, c.layout), lambda ps=ps, lay=lay: m.lr._jit_c2_module(HEAD_DIM, ROPE_DIM, ps, lay))
        elif c.op.startswith("index_k"):
            add(("ik", ps, c.ratio), lambda ps=ps, r=c.ratio: m.fir._jit_index_k_module(
                INDEX_DIM, ROPE_DIM, ps, r))
        elif c.op == "kv_store":
            lay = m.KVLayout.parse(c.layout)
            add(("st", ps, c.layout), lambda ps=ps, lay=lay: m.attn._jit_fused_store_module(
                name="flashmla", input_dtype=torch.bfloat16, index_dtype=torch.int64,
                page_size=ps, layout=lay))
    return out


# --------------------------------------------------------------------------------------
# The stand-in peer of --selftest: the whole-sequence oracle applied row by row
# --------------------------------------------------------------------------------------
class OracleStandIn:
    """The reference's signatures computed with dsv4_ops.testing.reference_v41 (float64
    pooling and norm, torch's conversions): what --selftest compares dsv4_ops with."""

    name = "oracle stand-in"
    # Its pairs pool in float64: where the float32 pooled value of a kernel lands on a bf16
    # rounding tie, the two round apart by one ulp, which the norm can widen to two.
    latent_max_ulp = 2

    @staticmethod
    def _store(latent, rope_pos, freqs, cache, slots, layout, ps):
        from dsv4_ops.testing import reference_v41 as R

        rot = R.rope_latent(latent, rope_pos, freqs)
        R.store_rows(cache, R.stored_value(rot, layout), slots, layout, ps)

    def c1_decode_norm_rope_store(self, kv_input, norm_weight, positions, out_loc, eps,
                                  freqs_cis, k_cache, *, page_size, layout="v4", out=None):
        from dsv4_ops.testing import reference_v41 as R

        lat, _ = R.latents(kv_input, 1, norm_weight, eps)
        out.copy_(lat)
        self._store(lat, positions.long(), freqs_cis, k_cache, out_loc.long(), layout, page_size)
        return out

    def _pairs(self, kv_input, state, norm_weight, eps, freqs, cache, pos, raw, odd_rows,
               partners, layout, ps, out):
        from dsv4_ops.testing import reference_v41 as R

        if odd_rows.numel() == 0:
            return
        pairs = torch.stack([partners, kv_input[odd_rows]], 1).reshape(-1, 2 * HEAD_DIM)
        lat, _ = R.latents(pairs, 2, norm_weight, eps)
        out[odd_rows] = lat
        self._store(lat, pos[odd_rows] - 1, freqs, cache, raw[odd_rows] >> 1, layout, ps)

    def c2_decode_norm_rope_store(self, kv_input, kv_state, norm_weight, positions, req,
                                  raw_out_loc, eps, freqs_cis, k_cache, *, page_size, ring_size,
                                  draft_len=1, layout="v4", out=None):
        pos, rid, raw = positions.long(), req.long(), raw_out_loc.long()
        t = torch.arange(pos.numel())
        live = raw > 0
        odd = (live & (pos % 2 == 1)).nonzero().flatten()
        even = (live & (pos % 2 == 0)).nonzero().flatten()
        in_block = (t[odd] % draft_len != 0) if draft_len > 1 else torch.zeros_like(odd, dtype=torch.bool)
        ring_rows = kv_state[rid[odd] * ring_size + (pos[odd] - 1) % ring_size]
        partners = torch.where(in_block[:, None], kv_input[(odd - 1).clamp(min=0)], ring_rows)
        self._pairs(kv_input, kv_state, norm_weight, eps, freqs_cis, k_cache, pos, raw, odd,
                    partners, layout, page_size, out)
        kv_state[rid[even] * ring_size + pos[even] % ring_size] = kv_input[even]
        return out

    def c2_prefill_norm_rope_store(self, kv_input, kv_state, norm_weight, positions, req,
                                   raw_out_loc, eps, freqs_cis, k_cache, extend_start_loc,
                                   extend_seq_lens, *, page_size, ring_size, layout="v4",
                                   out=None):
        pos, rid, raw = positions.long(), req.long(), raw_out_loc.long()
        odd, partners, parks = [], [], []
        for s, n in zip(extend_start_loc.tolist(), extend_seq_lens.tolist()):
            for t in range(s, s + n):
                if raw[t] == 0 or pos[t] % 2 == 0:
                    continue
                inside = (t - 1 >= s and rid[t - 1] == rid[t] and pos[t - 1] == pos[t] - 1
                          and raw[t - 1] != 0)
                odd.append(t)
                partners.append(kv_input[t - 1] if inside else
                                kv_state[rid[t] * ring_size + (pos[t] - 1) % ring_size])
            parks += [t for t in range(max(s, s + n - ring_size), s + n) if raw[t] != 0]
        if odd:
            self._pairs(kv_input, kv_state, norm_weight, eps, freqs_cis, k_cache, pos, raw,
                        torch.tensor(odd), torch.stack(partners), layout, page_size, out)
        for t in parks:
            kv_state[rid[t] * ring_size + pos[t] % ring_size] = kv_input[t]
        return out

    def fused_store_cache(self, input, cache, indices, *, page_size, type="flashmla",
                          layout="v4", freqs_cis=None):
        from dsv4_ops.testing import reference_v41 as R
        from dsv4_ops.testing.reference import rope

        v = input.float()
        if freqs_cis is not None:
            v = rope(v.double(), torch.arange(v.shape[0]), freqs_cis, HEAD_DIM - ROPE_DIM)
            v = v.float().to(input.dtype).float()
        R.store_rows(cache, v, indices.long(), layout, page_size)

    class CompressorDecodePlan:
        """(ratio, seq_lens): what the stand-in's store needs of a decode plan."""

        @staticmethod
        def generate_legacy(compress_ratio, req_pool_indices, seq_lens):
            return (compress_ratio, seq_lens)

    def compress_norm_rope_store(self, kv, plan, *, norm_weight, norm_eps, freq_cis, out_loc,
                                 kvcache, page_size, layout="v4"):
        from dsv4_ops.testing import reference_v41 as R
        from dsv4_ops.testing.reference import rope

        ratio, seq = plan[0], plan[1].long()
        rows = (seq % ratio == 0).nonzero().flatten()
        x = kv[rows].double()
        w = norm_weight.to(kv.dtype).double()
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm_eps) * w
        y = rope(y.to(kv.dtype).double(), seq[rows] - ratio, freq_cis, HEAD_DIM - ROPE_DIM)
        R.store_rows(kvcache, y.to(kv.dtype).float(), out_loc[rows].long(), layout, page_size)

    def index_k_norm_rope_pack_store(self, input, norm_weight, eps, freqs_cis, positions, loc,
                                     cache, *, ratio):
        from dsv4_ops.testing import reference_v41 as R

        R.index_k_store(cache, input, norm_weight, eps, freqs_cis, positions, loc, ratio,
                        cache.shape[1] // INDEX_K_SLOT_BYTES)


# --------------------------------------------------------------------------------------
# Conformance
# --------------------------------------------------------------------------------------
def _ordered_bf16(x: torch.Tensor) -> torch.Tensor:
    """bf16 bit patterns as integers ordered like the values (ulp distance = difference)."""
    i = x.view(torch.int16).to(torch.int32)
    mag = i & 0x7FFF
    return torch.where(i < 0, -mag, mag)


def _token_byte_mask(flat_len: int, slots: torch.Tensor, layout, ps: int, device):
    """bool [flat_len]: the data and scale bytes of cache slots `slots` (> 0)."""
    import dsv4_ops.layout as L

    mask = torch.zeros(flat_len, dtype=torch.bool, device=device)
    slots = slots[slots > 0]
    if slots.numel():
        lay = L.KVLayout.parse(layout)
        d, s = lay.token_offsets(slots.to(torch.int64), ps)
        mask[(d[:, None] + torch.arange(lay.data_bytes, device=device)).flatten()] = True
        if lay.scale_bytes:
            mask[(s[:, None] + torch.arange(lay.scale_bytes, device=device)).flatten()] = True
    return mask


def stored_slots(inp: Dict[str, Any]) -> torch.Tensor:
    """int64: the cache slots the case's op writes (one per storing row)."""
    case = inp["case"]
    if case.op.startswith("index_k"):
        loc = inp["loc"]
        return loc[loc > 0].to(torch.int64)
    if case.op == "kv_store":
        return inp["loc"].to(torch.int64)
    if case.op == "cnrs":
        return inp["out_loc"].to(torch.int64)
    slot = inp["slot"][written_rows(inp)]
    return slot[slot > 0].to(torch.int64)


def token_bytes_at(inp: Dict[str, Any], slots: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(data, scales): flat byte indices [n, bytes] of the tokens at cache slots `slots`
    (index-K: 64 code and 4 exponent bytes; layouts: data and written scale bytes)."""
    import dsv4_ops.layout as L

    case, dev = inp["case"], slots.device
    if case.op.startswith("index_k"):
        nd, ns = 64, 4
        d, s = L.token_byte_offsets(slots, case.page_size, nd, ns,
                                    INDEX_K_SLOT_BYTES * case.page_size)
    else:
        lay = L.KVLayout.parse(case.layout)
        nd, ns = lay.data_bytes, lay.scales_written
        d, s = lay.token_offsets(slots, case.page_size)
    return (d[:, None] + torch.arange(nd, device=dev), s[:, None] + torch.arange(ns, device=dev))


def slots_with_data(flat: torch.Tensor, inp: Dict[str, Any]) -> int:
    """How many of the stored slots hold a token whose data bytes are not all zero (the
    caches start zeroed): both engines writing nothing would otherwise conform."""
    slots = stored_slots(inp)
    if not slots.numel():
        return 0
    d, _ = token_bytes_at(inp, slots)
    return int((flat[d] != 0).any(dim=1).sum())


def conformance(inp: Dict[str, Any], ref: Dict[str, torch.Tensor],
                ours: Dict[str, torch.Tensor], max_ulp: int = 1) -> Dict[str, Any]:
    """The rules of the module docstring ({"ok": bool, ...counts}), a differing latent element
    being allowed `max_ulp` bf16 ulps. Both engines must also have stored every slot the case
    stores (`slots_with_data`)."""
    res = _conformance(inp, ref, ours, max_ulp)
    expected = int(stored_slots(inp).numel())
    got = {a: slots_with_data(o["cache"].view(torch.uint8).reshape(-1), inp)
           for a, o in zip(APIS, (ref, ours))}
    res.update(slots_expected=expected, **{f"slots_{a}": g for a, g in got.items()})
    res["ok"] = bool(res["ok"] and all(g == expected for g in got.values()))
    return res


def _conformance(inp, ref, ours, max_ulp: int) -> Dict[str, Any]:
    case = inp["case"]
    res: Dict[str, Any] = {}
    fr = ref["cache"].view(torch.uint8).reshape(-1)
    fo = ours["cache"].view(torch.uint8).reshape(-1)
    if case.op == "kv_store":
        nd = int((fr != fo).sum())
        res.update(cache_bytes_differ=nd, ok=nd == 0)
        return res
    if case.op.startswith("index_k") or case.op == "cnrs":
        live = stored_slots(inp)
        d, s = token_bytes_at(inp, live)
        tok_diff = (fr[d] != fo[d]).any(1) | (fr[s] != fo[s]).any(1)
        n_tok = int(tok_diff.sum())
        outside = torch.ones_like(fr, dtype=torch.bool)
        outside[d.flatten()] = False
        outside[s.flatten()] = False
        n_out = int((fr[outside] != fo[outside]).sum())
        res.update(tokens=int(live.numel()), tokens_differ=n_tok, bytes_outside_differ=n_out,
                   ok=n_out == 0 and n_tok <= 0.001 * max(1, live.numel()))
        return res
    rows = written_rows(inp)
    diff = (_ordered_bf16(ref["latent"]) - _ordered_bf16(ours["latent"])).abs()
    n_el = int(rows.sum()) * HEAD_DIM
    worst = int(diff.max()) if diff.numel() else 0
    n_1ulp = int((diff == 1).sum())
    n_differ = int((diff != 0).sum())
    latent_ok = worst <= max_ulp and n_differ <= 0.001 * max(1, n_el)
    differ_rows = (diff != 0).any(dim=1) & rows
    excl = _token_byte_mask(fr.numel(), inp["slot"][differ_rows], case.layout, case.page_size,
                            fr.device)
    n_cache = int(((fr != fo) & ~excl).sum())
    res.update(latent_elems=n_el, latent_max_ulp=worst, latent_1ulp=n_1ulp,
               latent_differ=n_differ,
               latent_rows_differ=int(differ_rows.sum()), cache_bytes_differ=n_cache)
    ok = latent_ok and n_cache == 0
    if "state" in ref:
        st = bool(torch.equal(ref["state"], ours["state"]))
        res["state_equal"] = st
        ok = ok and st
    res["ok"] = ok
    return res


def arbitrate_latents(inp: Dict[str, Any], outs: Dict[str, Dict[str, torch.Tensor]],
                      res: Dict[str, Any]) -> Dict[str, Any]:
    """Where the two engines' latents differ by more than the rule allows, the float64 oracle
    decides (contract V4.1 6). In a pair whose terms nearly cancel, fp32 pooling is off the
    exact value by several bf16 ulps in any operation order, so the bound is relative: dsv4_ops
    conforms when its latents are no farther from the oracle than the reference's (in max
    ulps, 2 allowed in any case, contract V4.1 5.1), at most 0.1 % of its elements differ
    from the oracle, its cache bytes equal the reference's wherever the latents agree and
    the rings are equal."""
    cpu = {k: (v.cpu() if torch.is_tensor(v) else v) for k, v in inp.items()}
    oracle = fresh_outputs(cpu)
    call_fn(OracleStandIn(), cpu, oracle)()
    rows = written_rows(cpu)
    want = _ordered_bf16(oracle["latent"][rows])
    out = dict(res)
    for name in APIS:
        d = (_ordered_bf16(outs[name]["latent"].cpu()[rows]) - want).abs()
        out[f"oracle_max_ulp_{name}"] = int(d.max()) if d.numel() else 0
        out[f"oracle_differ_{name}"] = int((d != 0).sum())
        out[f"oracle_beyond_1ulp_{name}"] = int((d > 1).sum())
    bound = max(2, out["oracle_max_ulp_sglang"])
    ours_ok = (out["oracle_max_ulp_dsv4"] <= bound
               and out["oracle_differ_dsv4"] <= 0.001 * max(1, res["latent_elems"]))
    slots_ok = all(res.get(f"slots_{a}") == res.get("slots_expected") for a in APIS)
    out["arbitrated"] = True
    out["ok"] = bool(ours_ok and slots_ok and res["cache_bytes_differ"] == 0
                     and res.get("state_equal", True))
    return out


# --------------------------------------------------------------------------------------
# Bytes (minimum DRAM traffic, read + written)
# --------------------------------------------------------------------------------------
def token_bytes(layout) -> int:
    """Cache bytes a store writes per token: data and written scale bytes."""
    import dsv4_ops.layout as L

    lay = L.KVLayout.parse(layout)
    return lay.data_bytes + lay.scales_written


def case_bytes(inp: Dict[str, Any]) -> int:
    """Every input row read once with its position / request / location (8 B each), the ring
    rows an odd row pairs with, a freqs row (256 B) per rotated row, the norm weight; the
    latent rows, the cache bytes and the state rows written (prefill: each request's last
    min(len, ring) rows parked)."""
    case, n = inp["case"], inp["n"]
    pos = inp["positions"]
    if case.op.startswith("index_k"):
        live = int((inp["loc"] > 0).sum())
        return n * (INDEX_DIM * 2 + 16) + live * (ROPE_DIM * 4 + INDEX_K_SLOT_BYTES) + INDEX_DIM * 2
    if case.op == "cnrs":  # every row closes a window: kv, freqs row, out_loc, plan row
        return n * (inp["kv"].element_size() * HEAD_DIM + ROPE_DIM * 4 + 8 + 16
                    + token_bytes(case.layout)) + HEAD_DIM * 4
    if case.op == "kv_store":
        rope = 0 if inp["freqs_rows"] is None else ROPE_DIM * 4
        return n * (HEAD_DIM * 2 + 8 + rope + token_bytes(case.layout))
    tok = token_bytes(case.layout)
    if case.op.startswith("c1"):
        stored = int((inp["raw_out_loc"] > 0).sum())
        return n * (HEAD_DIM * 2 + 16 + HEAD_DIM * 2) + stored * (ROPE_DIM * 4 + tok) + HEAD_DIM * 2
    row = 2 * HEAD_DIM * 4
    live = inp["raw_out_loc"] > 0
    odd = live & (pos % 2 == 1)
    n_odd, n_even = int(odd.sum()), int((live & (pos % 2 == 0)).sum())
    if case.op == "c2_prefill":
        first = torch.zeros_like(odd)
        first[inp["extend_start_loc"].long()] = True
        ring_reads = int((odd & first).sum())
        parks = sum(min(int(e), case.ring) for e in inp["extend_seq_lens"].tolist())
    else:
        t = torch.arange(n, device=pos.device)
        ring_reads = int((odd & (t % case.draft_len == 0)).sum())
        parks = n_even
    read = n * (row + 24) + ring_reads * row + n_odd * ROPE_DIM * 4 + HEAD_DIM * 2
    return read + n_odd * (HEAD_DIM * 2 + tok) + parks * row


# --------------------------------------------------------------------------------------
# The driver
# --------------------------------------------------------------------------------------
def run_case(case: Case, apis: Dict[str, Any], timer: C.Timer, s: Settings, device,
             time_it: bool = True) -> Dict[str, Any]:
    inp = build_inputs(case, device)
    rec: Dict[str, Any] = {"case": case.name, "op": case.op, "prefill": case.is_prefill,
                           "layout": case.layout,
                           "page_size": case.page_size, "rows": inp["n"],
                           "bytes": case_bytes(inp)}
    outs, fns = PC.shared_input_calls(apis, inp, fresh_outputs, call_fn, timer, rec)
    if len(fns) == 2:
        rec["conformance"] = conformance(inp, *(outs[a] for a in APIS),
                                         max_ulp=getattr(apis["sglang"], "latent_max_ulp", 1))
        if not rec["conformance"]["ok"] and "latent_max_ulp" in rec["conformance"]:
            rec["conformance"] = arbitrate_latents(inp, outs, rec["conformance"])
    if time_it:
        PC.time_calls(fns, timer, s, inp["n"] >= 4096, rec)
        rec["floor_us"] = PC.copy_floor_us(timer, s, rec["bytes"])
    del outs, fns, inp
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    PC.add_args(ap, "peer_low_ratio_out",
                "layouts v41_fp4 and v4, decode batch 8 and 1024, two verify cases",
                peer_help="the peer kit: sgl_bench.py, stubs/, wheels/ (benchmarks/README.md)")
    ap.add_argument("--layouts", default=None, help="comma list (default: all, --quick: 2)")
    ap.add_argument("--page-sizes", default="64")
    PC.add_run_args(ap, "CPU: tiny cases, dsv4_ops against the oracle stand-in")
    args, t_start, info, cases = PC.parse(ap, argv, lambda a: case_list(
        a.quick, a.layouts.split(",") if a.layouts else None,
        [int(p) for p in a.page_sizes.split(",")], selftest=a.selftest))
    run = PC.engines("peer_low_ratio", args, info,
                     lambda: {"sglang": OracleStandIn(), "dsv4": dsv4_api()},
                     "oracle stand-in (selftest)", sglang_api, dsv4_api,
                     lambda api: sglang_builders(api, cases))
    if run is None:
        return 1
    apis, device, s = run
    try:
        import dsv4_ops

        info["dsv4_library"] = dsv4_ops.ops._library.LIBRARY_PATH
    except Exception as e:  # noqa: BLE001
        info["dsv4_import_error"] = f"{type(e).__name__}: {e}"
    timer, ceiling = PC.begin(info, device, cases, PC.TEXT_HEADER, show_ceiling=True)
    recs, rows, skipped, status = PC.run_all(
        "peer_low_ratio", cases, lambda c: run_case(c, apis, timer, s, device, time_it=True),
        lambda c, msg: {"case": c.name, "op": c.op, "prefill": c.is_prefill, "bytes": None,
                        "dsv4_error": msg},
        PC.joined_row, PC.text_row, timer, info,
        deadline=t_start + args.budget_s if args.budget_s else None)
    summary = PC.summarize(rows)
    summary.update(run_seconds=round(time.monotonic() - t_start, 1), skipped_for_time=skipped)
    payload = {"env": info, "ceiling": ceiling, "args": vars(args), "summary": summary,
               "joined": rows, "records": recs}
    PC.write_results(args.out, "low_ratio", payload, PC.markdown(
        rows, summary, info, ceiling, "# dsv4_ops V4.1 ops vs the reference engine (sglang) kernels"))
    for k, v in summary["prefill_dsv4_pct_floor"].items():
        log(f"prefill {k}: % floor dsv4 {PC.fmt(v)}, sglang "
            f"{PC.fmt(summary['prefill_sglang_pct_floor'].get(k))}")
    log(PC.summary_line(summary))
    log(f"wrote {args.out}/low_ratio.json and low_ratio.md (exit {status})")
    return status


if __name__ == "__main__":
    sys.exit(main())
