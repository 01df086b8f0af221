#!/usr/bin/env python3
"""The fp8_ds_mla store of one token (compress_norm_rope_store, head_dim 512, layout v4) in three
arithmetics, and the comparison of their cache bytes (docs/design/store_reference_match.md).

* `reference`: the reference engine's kernel (fused_norm_rope_flashmla, read from its SASS): one
  thread per dim pair (x0*x0, then fma(x1, x1, .)), the 32-lane xor tree of each warp, the
  8-warp xor tree (`block` order); rsqrtf, i.e. the MUFU.RSQ approximation.
* `ours`: dsv4_ops (store_math.h): the same `block` order; 1.0f / sqrtf. The `lane` order (16
  fused multiply-adds per lane of the lane layout over (j, k), then the 32-lane xor tree: the
  128-dim stores' and V4.1 layouts' order) is here for comparison.
The reference's rsqrt is modelled as the correctly rounded one (`cr`), as that one moved by k
ulps (`cr+k`, to bound what the approximation can move), or, given the table of the GPU's
rsqrtf that peer_store_match.py measures, as the hardware's own results (`table`).
* `exact`: float64 throughout, rounded once by the store's encoding.
Everything after the normalisation (product order x * inv * w, the RoPE products, bf16 rounding
points, UE8M0 rule, e4m3 conversion) is the same in both engines, so one function computes it.
Every fp32 operation is an IEEE operation of numpy float32; a fused multiply-add is computed
exactly in float64 and rounded once (fma32).

    python -m benchmarks.store_reference_model [--tokens N] [--seed S] [--json FILE]
    python -m benchmarks.store_reference_model --dump DIR      # files of peer_store_match.py

Without --dump: harness-like tokens (the peer harness's c4 inputs: kv_score N(0, 1), ape
0.5 N(0, 1), norm weights 1 + 0.1 N(0, 1), pooled by the float64 oracle; the positions of its
p8x4096 and p4x2000+2048 prefills), the CPU op checked against `ours` byte for byte, then
ours vs the reference model vs exact math. With --dump: the same on the kv rows the two engines
stored on the GPU, with both engines' real bytes.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Any, Dict, Optional

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dsv4_ops.layout import STORE_FORMATS, KVLayout  # noqa: E402  (after the path set-up)

_DS_MLA = STORE_FORMATS["fp8_ds_mla"]
HD = _DS_MLA.head_dim
GROUP = KVLayout("v4").tile_size        # dims of one UE8M0 scale
NOPE = _DS_MLA.scale_bytes * GROUP      # the e4m3 dims, one scale a group
ROPE = HD - NOPE                        # the bf16 RoPE dims
F32 = np.float32
F64 = np.float64
RSQRT_MODES = ("div_sqrt", "cr", "table")
TABLE_FIRST = 0x3F800000  # fp32 bits of 1.0: the rsqrt table covers [1, 4), 2^24 inputs


# ---------------------------------------------------------------------------------------
# fp32 building blocks
# ---------------------------------------------------------------------------------------
def bits(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=F32).view(np.uint32)


def from_bits(u: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(u, dtype=np.uint32).view(F32)


def round_f64_to_f32(s: np.ndarray, err: np.ndarray) -> np.ndarray:
    """fp32 round-to-nearest-even of the exact value s + err (s = fl64(s + err)). Rounding s
    alone differs only when s lies exactly halfway between two floats and err != 0."""
    r = s.astype(F32)
    r64 = r.astype(F64)
    other = np.where(r64 > s, np.nextafter(r, F32(-np.inf)), np.nextafter(r, F32(np.inf)))
    tie = (r64 != s) & (np.abs(r64 - s) == np.abs(other.astype(F64) - s)) & (err != 0)
    if tie.any():
        up = np.maximum(r, other)
        down = np.minimum(r, other)
        r = np.where(tie, np.where(err > 0, up, down), r)
    return r


def fma32(a, b, c) -> np.ndarray:
    """fp32 fused multiply-add a * b + c with one rounding (normal-range operands)."""
    a64 = np.asarray(a, dtype=F32).astype(F64)
    b64 = np.asarray(b, dtype=F32).astype(F64)
    c64 = np.asarray(c, dtype=F32).astype(F64)
    p = a64 * b64  # exact: 24 x 24 bits
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)  # TwoSum: s + err == p + c exactly
    return round_f64_to_f32(s, err)


def xor_tree(v: np.ndarray, width: int) -> np.ndarray:
    """The xor-butterfly sum of the last axis (length width) as a shuffle reduction computes
    it, masks width/2 .. 1; every lane ends with the same value (IEEE addition commutes)."""
    lanes = np.arange(width)
    m = width // 2
    while m:
        v = (v + v[..., lanes ^ m]).astype(F32)
        m //= 2
    return v[..., 0]


def bf16_round32(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 round-to-nearest-even, as fp32 (finite inputs)."""
    u = bits(x).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16
    return from_bits(u.astype(np.uint32))


def bf16_round64(x: np.ndarray) -> np.ndarray:
    """float64 -> bf16 round-to-nearest-even in one rounding, as float64 (normal range)."""
    m, e = np.frexp(np.asarray(x, dtype=F64))
    return np.ldexp(np.rint(m * 256.0), e - 8)


def ulp32(x: np.ndarray) -> np.ndarray:
    x = np.abs(np.asarray(x, dtype=F32))
    return (np.nextafter(x, F32(np.inf)) - x).astype(F64)


# ---------------------------------------------------------------------------------------
# The normalisation in each engine's order
# ---------------------------------------------------------------------------------------
def sumsq_lane(x: np.ndarray) -> np.ndarray:
    """dsv4_ops (store_math.h): lane l accumulates dims 128j + 4l + k in (j, k) order with
    fused multiply-adds from 0, then the 32-lane xor tree."""
    xl = x.reshape(x.shape[0], HD // 128, 32, 4)  # [n, j, lane, k]
    acc = np.zeros(xl.shape[0:1] + (32,), dtype=F32)
    for j in range(HD // 128):
        for k in range(4):
            acc = fma32(xl[:, j, :, k], xl[:, j, :, k], acc)
    return xor_tree(acc, 32)


def sumsq_block(x: np.ndarray) -> np.ndarray:
    """The reference: thread t holds dims (2t, 2t+1): x0*x0 rounded, fma(x1, x1, .); the xor
    tree over the 32 lanes of each warp (dims 64w .. 64w+63), then over the 8 warp sums."""
    xp = x.reshape(x.shape[0], HD // 2, 2)
    p = fma32(xp[..., 1], xp[..., 1], (xp[..., 0] * xp[..., 0]).astype(F32))
    warp = xor_tree(p.reshape(x.shape[0], 8, 32), 32)
    return xor_tree(warp, 8)


SUMSQ = {"lane": sumsq_lane, "block": sumsq_block}


def mean_eps(sumsq: np.ndarray, eps: float) -> np.ndarray:
    """fma(sum, 1/512, eps): both engines (the product is exact)."""
    return fma32(sumsq, F32(1.0 / HD), F32(eps))


def rsqrt_div_sqrt(v: np.ndarray) -> np.ndarray:
    """dsv4_ops: 1.0f / sqrtf(v), two IEEE roundings."""
    return (F32(1.0) / np.sqrt(np.asarray(v, dtype=F32))).astype(F32)


def rsqrt_cr(v: np.ndarray) -> np.ndarray:
    """Correctly rounded fp32 1/sqrt(v) (positive normal v). The float64 quotient is within
    2^-51 of the exact value; where that is too close to a rounding boundary of fp32 to decide,
    the boundary is compared exactly in integers."""
    v = np.asarray(v, dtype=F32)
    d = 1.0 / np.sqrt(v.astype(F64))
    r = d.astype(F32)
    r64 = r.astype(F64)
    half = ulp32(r) / 2
    near = np.abs(np.abs(d - r64) - half) <= np.abs(d) * 2.0 ** -48
    for i in np.flatnonzero(near):
        r[i] = _rsqrt_cr_exact(float(v.flat[i]), float(r.flat[i]))
    return r


def _rsqrt_cr_exact(v: float, r: float) -> np.float32:
    """The fp32 neighbour of r (or r) nearest to 1/sqrt(v), decided in exact rationals: the
    midpoint m between two candidates is above 1/sqrt(v) iff v * m^2 > 1."""
    from fractions import Fraction

    fv = Fraction(v)
    cands = sorted({float(np.nextafter(F32(r), F32(-np.inf))), r,
                    float(np.nextafter(F32(r), F32(np.inf)))})
    best = cands[0]
    for lo, hi in zip(cands, cands[1:]):
        m = (Fraction(lo) + Fraction(hi)) / 2
        if fv * m * m < 1:  # 1/sqrt(v) above the midpoint
            best = hi
        elif fv * m * m == 1:  # a tie (cannot happen for fp32 inputs): to even
            best = lo if (bits(np.array([lo]))[0] & 1) == 0 else hi
    return F32(best)


class RsqrtTable:
    """The hardware's rsqrtf over [1, 4) (2^24 inputs, fp32 bits 0x3F800000 .. 0x407FFFFF),
    stored as the difference in ulps from fp32(1.0 / sqrt(double x)); other inputs by
    rsqrt(x * 4^k) = rsqrt(x) / 2^k (peer_store_match.py checks that rule on the GPU)."""

    def __init__(self, path: str):
        z = np.load(path)
        self.dev = z["dev"].astype(np.int64)
        x = from_bits(np.arange(TABLE_FIRST, TABLE_FIRST + self.dev.size, dtype=np.uint32))
        base = (1.0 / np.sqrt(x.astype(F64))).astype(F32)
        if "check_index" in z.files:  # the GPU's base values at a sample: same IEEE doubles
            if not np.array_equal(bits(base[z["check_index"]]), z["check_base_bits"]):
                raise ValueError(f"{path}: the GPU's fp32(1/sqrt(double)) differs from numpy's")
        self.values = from_bits((bits(base).astype(np.int64) + self.dev).astype(np.uint32))
        self.meta = {k: z[k].tolist() for k in z.files if k.startswith("meta_")}

    def __call__(self, v: np.ndarray) -> np.ndarray:
        v = np.asarray(v, dtype=F32)
        e = ((bits(v) >> 23) & 0xFF).astype(np.int64) - 127
        par = e & 1
        k = (e - par) // 2
        idx = (bits(v) & 0x7FFFFF).astype(np.int64) + (par << 23)
        return np.ldexp(self.values[idx].astype(F64), -k).astype(F32)


def rsqrt_fn(mode: str, table: Optional[RsqrtTable] = None):
    if mode == "div_sqrt":
        return rsqrt_div_sqrt
    if mode == "cr":
        return rsqrt_cr
    if mode.startswith("cr"):  # cr+k / cr-k: the correctly rounded value moved by k ulps
        k = int(mode[2:])
        return lambda v: from_bits((bits(rsqrt_cr(v)).astype(np.int64) + k).astype(np.uint32))
    if mode == "table":
        if table is None:
            raise ValueError("rsqrt mode 'table' needs a measured table (--rsqrt-table)")
        return table
    raise ValueError(f"unknown rsqrt mode {mode!r}")


def inv_rms(x: np.ndarray, eps: float, order: str, rsqrt: str,
            table: Optional[RsqrtTable] = None) -> np.ndarray:
    return rsqrt_fn(rsqrt, table)(mean_eps(SUMSQ[order](x), eps))


def inv_rms_exact(x: np.ndarray, eps: float) -> np.ndarray:
    x64 = x.astype(F64)
    return 1.0 / np.sqrt((x64 * x64).mean(axis=-1) + eps)


# ---------------------------------------------------------------------------------------
# Normed and rotated values; the cache row
# ---------------------------------------------------------------------------------------
def norm_rope32(x: np.ndarray, w: np.ndarray, f: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """(x * inv) * w in fp32, then the RoPE of dims 448..511 with f [n, 64] = (cos, sin) pairs:
    re' = fma(re, c, -(im * s)), im' = fma(re, s, im * c) (both engines)."""
    y = ((x * inv[:, None]).astype(F32) * w[None, :]).astype(F32)
    re, im = y[:, NOPE::2].copy(), y[:, NOPE + 1::2].copy()
    c, s = f[:, 0::2].astype(F32), f[:, 1::2].astype(F32)
    y[:, NOPE::2] = fma32(re, c, -(im * s).astype(F32))
    y[:, NOPE + 1::2] = fma32(re, s, (im * c).astype(F32))
    return y


def norm_rope64(x: np.ndarray, w: np.ndarray, f: np.ndarray, eps: float) -> np.ndarray:
    y = x.astype(F64) * inv_rms_exact(x, eps)[:, None] * w.astype(F64)[None, :]
    re, im = y[:, NOPE::2].copy(), y[:, NOPE + 1::2].copy()
    c, s = f[:, 0::2].astype(F64), f[:, 1::2].astype(F64)
    y[:, NOPE::2] = re * c - im * s
    y[:, NOPE + 1::2] = re * s + im * c
    return y


def engine_y(engine: str, x, w, f, eps, rsqrt: Optional[str] = None,
             table: Optional[RsqrtTable] = None, order: Optional[str] = None) -> np.ndarray:
    """fp32 normed+rotated values of `engine` ('ours' or 'reference'); rsqrt / order override
    the engine's own choices (for the what-if rows of the report)."""
    order = order or "block"
    rsqrt = rsqrt or ("div_sqrt" if engine == "ours" else "cr")
    return norm_rope32(x, w, f, inv_rms(x, eps, order, rsqrt, table))


def encode_rows(y: np.ndarray) -> Dict[str, np.ndarray]:
    """The fp8_ds_mla row of fp32 values y [n, 512] (contract 4), by the whole-sequence
    oracle's encoder: {'data': uint8 [n, 576], 'scales': uint8 [n, 7]}."""
    import torch

    from dsv4_ops.testing import reference

    if y.shape[0] == 0:
        return {"data": np.zeros((0, _DS_MLA.data_bytes), np.uint8),
                "scales": np.zeros((0, _DS_MLA.scale_bytes), np.uint8)}
    data, scales = reference.encode(torch.from_numpy(np.ascontiguousarray(y, dtype=F32)),
                                    "fp8_ds_mla")
    return {"data": data.numpy(), "scales": scales.numpy()}


def exact_fields(y64: np.ndarray) -> Dict[str, np.ndarray]:
    """The exact values the bytes stand for: bf16(y) in one rounding, the UE8M0 exponent of each
    group from those (the format's rule), and y itself."""
    yb = bf16_round64(y64)
    amax = np.maximum(np.abs(yb[:, :NOPE]).reshape(yb.shape[0], NOPE // GROUP, GROUP).max(-1), 1e-4)
    q = (amax.astype(F32) / F32(448.0)).astype(F32)
    m = bits(q)
    e = ((m >> 23) & 0xFF).astype(np.int64) + ((m & 0x7FFFFF) != 0)
    return {"y": y64, "scales": e}


# ---------------------------------------------------------------------------------------
# Decoding bytes and comparing engines
# ---------------------------------------------------------------------------------------
def _e4m3_table() -> np.ndarray:
    v = np.zeros(256, dtype=F64)
    for c in range(256):
        s, e, m = c >> 7, (c >> 3) & 0xF, c & 7
        mag = (m / 8.0) * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
        v[c] = -mag if s else mag
    v[0x7F] = v[0xFF] = np.nan
    return v


E4M3 = _e4m3_table()


def decode(data: np.ndarray, scales: np.ndarray) -> Dict[str, np.ndarray]:
    """Fields of fp8_ds_mla rows: codes [n, 448], scales [n, 7] (int), rope bf16 bits [n, 64],
    and the values they stand for (nope = e4m3 * 2^(e-127), rope = the bf16 value)."""
    data = np.ascontiguousarray(data, dtype=np.uint8)
    codes = data[:, :NOPE]
    sc = np.asarray(scales, dtype=np.int64)[:, : NOPE // GROUP]
    rope = data[:, NOPE:NOPE + 2 * ROPE].copy().view(np.uint16).astype(np.int64)
    nope_val = E4M3[codes] * np.repeat(np.ldexp(1.0, sc - 127), GROUP, axis=1)
    with np.errstate(invalid="ignore"):  # a signalling-NaN pattern is a value like any other here
        rope_val = from_bits((rope << 16).astype(np.uint32)).astype(F64)
    return {"codes": codes, "scales": sc, "rope": rope, "nope_val": nope_val, "rope_val": rope_val}


def _ordinal(v: np.ndarray, sign: int) -> np.ndarray:
    v = np.asarray(v, dtype=np.int64)
    return np.where((v & sign) != 0, -(v & (sign - 1)), v & (sign - 1))


def _closer(a_val, b_val, exact) -> Dict[str, int]:
    da, db = np.abs(a_val - exact), np.abs(b_val - exact)
    return {"a_closer": int((da < db).sum()), "b_closer": int((db < da).sum()),
            "tie": int((da == db).sum())}


def compare(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray], y64: Optional[np.ndarray] = None
            ) -> Dict[str, Any]:
    """Differences between two engines' rows (a, b: decode() fields): rope bf16 values by ulp
    distance, UE8M0 bytes, e4m3 codes (within groups of equal scales by step distance; the
    codes of groups whose scales differ counted apart), and where they differ which engine's
    value is nearer the exact one (y64: float64 normed+rotated values)."""
    out: Dict[str, Any] = {"tokens": int(a["codes"].shape[0])}
    dr = np.abs(_ordinal(a["rope"], 0x8000) - _ordinal(b["rope"], 0x8000))
    out["rope_values"] = int(dr.size)
    out["rope_diff"] = int((dr != 0).sum())
    out["rope_ulps"] = {str(u): int((dr == u).sum()) for u in range(1, 4)}
    out["rope_ulps"]["4-15"] = int(((dr >= 4) & (dr < 16)).sum())
    out["rope_ulps"][">=16"] = int((dr >= 16).sum())
    out["rope_max_ulps"] = int(dr.max()) if dr.size else 0
    ds = a["scales"] != b["scales"]
    out["scale_bytes"] = int(ds.size)
    out["scale_diff"] = int(ds.sum())
    out["scale_steps"] = sorted({int(v) for v in (a["scales"] - b["scales"])[ds]})
    same_scale = ~np.repeat(ds, GROUP, axis=1)
    dc = np.abs(_ordinal(a["codes"], 0x80) - _ordinal(b["codes"], 0x80))
    out["codes"] = int(dc.size)
    out["code_diff"] = int((a["codes"] != b["codes"]).sum())
    out["code_diff_same_scale"] = int(((dc != 0) & same_scale).sum())
    out["code_max_steps_same_scale"] = int(dc[same_scale].max()) if same_scale.any() else 0
    out["code_diff_in_rescaled_groups"] = int(((a["codes"] != b["codes"]) & ~same_scale).sum())
    out["tokens_diff"] = int(((dr != 0).any(1) | ds.any(1) | (a["codes"] != b["codes"]).any(1)).sum())
    if y64 is not None:
        ex = exact_fields(y64)
        m = dr != 0
        out["rope_nearer_exact"] = _closer(a["rope_val"][m], b["rope_val"][m], y64[:, NOPE:][m])
        m = (a["codes"] != b["codes"]) & same_scale
        out["code_nearer_exact"] = _closer(a["nope_val"][m], b["nope_val"][m], y64[:, :NOPE][m])
        out["scale_equal_exact"] = {"a": int((a["scales"] == ex["scales"])[ds].sum()),
                                    "b": int((b["scales"] == ex["scales"])[ds].sum())}
    return out


def worst_rope(a, b, y64, x, pos, top: int = 3):
    """The rope values farthest apart: token, dim, both bf16 values, exact value, ulps."""
    dr = np.abs(_ordinal(a["rope"], 0x8000) - _ordinal(b["rope"], 0x8000))
    flat = np.argsort(dr, axis=None)[::-1][:top]
    rows = []
    for i in flat:
        t, d = np.unravel_index(i, dr.shape)
        if dr[t, d] == 0:
            break
        rows.append({"token": int(t), "dim": NOPE + int(d), "pos": int(pos[t]),
                     "ulps": int(dr[t, d]), "a": float(a["rope_val"][t, d]),
                     "b": float(b["rope_val"][t, d]), "exact": float(y64[t, NOPE + d]),
                     "token_amax": float(np.abs(y64[t]).max())})
    return rows


# ---------------------------------------------------------------------------------------
# Constructed tokens: one difference of arithmetic decides a byte
# ---------------------------------------------------------------------------------------
def rows_of(x, w, f, eps, arith) -> Dict[str, np.ndarray]:
    """decode() fields of tokens x in the arithmetic arith = (sum order, rsqrt mode)."""
    return _dec(encode_rows(norm_rope32(x, w, f, inv_rms(x, eps, *arith))))


def _token_pair(rng, a, b, eps):
    """A harness-like token (x [1, 512], w [512]) whose factors differ between a and b, with
    dim 0 the largest |value| of group 0 (x[0] = 2, others ~ N(0, 0.3))."""
    for _ in range(1000):
        x = (rng.standard_normal((1, HD)) * 0.3).astype(F32)
        x[0, 0] = 2.0
        w = (1 + 0.1 * rng.standard_normal(HD)).astype(F32)
        ia, ib = inv_rms(x, eps, *a)[0], inv_rms(x, eps, *b)[0]
        if ia != ib:
            return x, w, ia, ib
    raise RuntimeError("no token with differing factors")


def identity_freqs(n: int = 1) -> np.ndarray:
    f = np.zeros((n, ROPE), dtype=F32)
    f[:, 0::2] = 1.0
    return f


def constructed_scale_flip(a=("lane", "div_sqrt"), b=("block", "div_sqrt"), eps: float = 1e-6,
                           seed: int = 0):
    """(x, w, f) of one token whose group-0 UE8M0 byte differs by one between arithmetics a
    and b: its largest value x[0] * inv * w[0] is put on the bf16 midpoint between
    1.75 * 2^k and the next bf16 value (2^(k-8) * 448 is where the scale steps), by a search
    of w[0] over a few fp32 ulps."""
    rng = np.random.default_rng(seed)
    f = identity_freqs()
    for _ in range(100):
        x, w, ia, ib = _token_pair(rng, a, b, eps)
        pa, pb = F32(x[0, 0] * ia), F32(x[0, 0] * ib)
        k = int(np.floor(np.log2(float(pa) / 1.75)))
        mid = (1.75 + 2.0 ** -8) * 2.0 ** k  # bf16 midpoint above 1.75 * 2^k
        w0 = F32(mid / ((float(pa) + float(pb)) / 2))
        for step in range(-16, 17):
            w[0] = F32(w0 + step * ulp32(np.array([w0]))[0])
            ra, rb = rows_of(x, w, f, eps, a), rows_of(x, w, f, eps, b)
            if ra["scales"][0, 0] != rb["scales"][0, 0]:
                return x, w, f
    raise RuntimeError("no scale flip found")


def constructed_rope_cancel(a=("lane", "div_sqrt"), b=("block", "div_sqrt"), eps: float = 1e-6,
                            min_ulps: int = 16, seed: int = 0):
    """(x, w, f) of one token whose first rotated value (dim 448) differs by at least min_ulps
    bf16 ulps between a and b: (cos, sin) of pair 0 = (c, 1) with c ~ im / re, so that
    re * c - im cancels (the freqs row need not have unit norm), c searched over a few ulps."""
    rng = np.random.default_rng(seed)
    f = identity_freqs()
    for _ in range(100):
        x, w, _, _ = _token_pair(rng, a, b, eps)
        yb = norm_rope32(x, w, f, inv_rms(x, eps, *b))
        c0 = F32(yb[0, NOPE + 1] / yb[0, NOPE])
        f[0, 1] = 1.0
        for step in range(-64, 65):
            f[0, 0] = F32(c0 + step * ulp32(np.array([c0]))[0])
            ra, rb = rows_of(x, w, f, eps, a), rows_of(x, w, f, eps, b)
            ulps = abs(int(_ordinal(ra["rope"][0, 0], 0x8000)) - int(_ordinal(rb["rope"][0, 0], 0x8000)))
            if ulps >= min_ulps:
                return x, w, f.copy()
        f[0, 0], f[0, 1] = 1.0, 0.0
    raise RuntimeError("no rope cancellation found")


def constructed_report(eps: float = 1e-6) -> Dict[str, Any]:
    """Differing bytes from one arithmetic difference at a time, on constructed tokens: a UE8M0
    byte one step apart, rope values 2 and 16 or more bf16 ulps apart."""
    pairs = {"sum_order": (("lane", "div_sqrt"), ("block", "div_sqrt")),
             "rsqrt": (("block", "div_sqrt"), ("block", "cr"))}
    out: Dict[str, Any] = {}
    for name, (a, b) in pairs.items():
        x, w, f = constructed_scale_flip(a, b, eps)
        ra, rb = rows_of(x, w, f, eps, a), rows_of(x, w, f, eps, b)
        steps = np.abs(_ordinal(ra["codes"][0, :GROUP], 0x80) - _ordinal(rb["codes"][0, :GROUP], 0x80))
        y64 = norm_rope64(x, w, f, eps)
        exact_e = int(exact_fields(y64)["scales"][0, 0])
        out[f"{name}_scale_flip"] = {
            "scales": [int(ra["scales"][0, 0]), int(rb["scales"][0, 0])], "exact_scale": exact_e,
            "group0_code_steps_median": float(np.median(steps)), "w0": float(w[0])}
        for min_ulps in (2, 16):
            x, w, f = constructed_rope_cancel(a, b, eps, min_ulps)
            ra, rb = rows_of(x, w, f, eps, a), rows_of(x, w, f, eps, b)
            y64 = norm_rope64(x, w, f, eps)
            out[f"{name}_rope_cancel_{min_ulps}"] = {
                "values": [float(ra["rope_val"][0, 0]), float(rb["rope_val"][0, 0])],
                "exact": float(y64[0, NOPE]), "token_amax": float(np.abs(y64).max()),
                "ulps": abs(int(_ordinal(ra["rope"][0, 0], 0x8000))
                            - int(_ordinal(rb["rope"][0, 0], 0x8000)))}
    return out


def perturbed_report(x, w, pos, f, eps, rel: float = 2.0 ** -21, seed: int = 1) -> Dict[str, Any]:
    """ours on x against ours on x perturbed by a few fp32 ulps (x * (1 + rel * N(0, 1))): what
    two engines' stores differ by when their kv rows (each engine's own pooling) differ."""
    rng = np.random.default_rng(seed)
    xp = (x * (1 + rel * rng.standard_normal(x.shape))).astype(F32)
    y64 = norm_rope64(x, w, f, eps)
    a = _dec(encode_rows(engine_y("ours", x, w, f, eps)))
    b = _dec(encode_rows(engine_y("ours", xp, w, f, eps)))
    out = compare(a, b, y64)
    out["relative_perturbation"] = rel
    return out


# ---------------------------------------------------------------------------------------
# Accuracy of the normalisation factor
# ---------------------------------------------------------------------------------------
def inv_accuracy(x: np.ndarray, eps: float, table: Optional[RsqrtTable] = None) -> Dict[str, Any]:
    """Each (sum order, rsqrt) pair's factor against float64: mean |error| in fp32 ulps, share
    of tokens exactly the correctly rounded value; and the sums' own errors."""
    ex = inv_rms_exact(x, eps)
    s_exact = (x.astype(F64) ** 2).sum(-1)
    res: Dict[str, Any] = {"tokens": int(x.shape[0])}
    for order in SUMSQ:
        s = SUMSQ[order](x)
        err = np.abs(s.astype(F64) - s_exact) / ulp32(s)
        res[f"sumsq_{order}_mean_abs_ulps"] = round(float(err.mean()), 4)
        res[f"sumsq_{order}_max_abs_ulps"] = round(float(err.max()), 3)
    sl, sb = SUMSQ["lane"](x), SUMSQ["block"](x)
    el, eb = np.abs(sl.astype(F64) - s_exact), np.abs(sb.astype(F64) - s_exact)
    res["sumsq_block_nearer_share"] = round(float((eb < el).mean()), 4)
    res["sumsq_lane_nearer_share"] = round(float((el < eb).mean()), 4)
    res["sumsq_equal_share"] = round(float((sl == sb).mean()), 4)
    modes = ["div_sqrt", "cr"] + (["table"] if table is not None else [])
    invs = {}
    for order in SUMSQ:
        for mode in modes:
            inv = inv_rms(x, eps, order, mode, table)
            invs[(order, mode)] = inv
            err = np.abs(inv.astype(F64) - ex) / ulp32(inv)
            res[f"inv_{order}_{mode}_mean_abs_ulps"] = round(float(err.mean()), 4)
    ours = invs[("lane", "div_sqrt")]
    for key, inv in invs.items():
        res[f"inv_equal_ours_{key[0]}_{key[1]}"] = round(float((inv == ours).mean()), 4)
    if table is not None:
        ref = invs[("block", "table")]
        for key, inv in invs.items():
            res[f"inv_equal_reference_{key[0]}_{key[1]}"] = round(float((inv == ref).mean()), 4)
    return res


# ---------------------------------------------------------------------------------------
# Inputs like the peer harness's
# ---------------------------------------------------------------------------------------
def harness_like_tokens(n_tokens: int, seed: int):
    """kv [n, 512] fp32 (pooled c4 tokens of N(0, 1) kv_score rows, ape 0.5 N(0, 1), by the
    float64 oracle, rounded to fp32), norm weights [512], positions (the prefills' closing
    positions: 0, 4, ..., 4092 repeated), freqs rows [n, 64] fp32 (the harness's table)."""
    import torch

    from dsv4_ops.layout import Compressor
    from dsv4_ops.testing import reference, worlds

    gen = torch.Generator().manual_seed(seed)
    comp = Compressor(4, HD)
    ape, w = worlds.compressor_weights(comp, gen)
    per_req = 1024
    toks, pos = [], []
    for r in range(-(-n_tokens // per_req)):
        rows = worlds.kv_score_rows(4 * per_req, 4, HD, gen)
        toks.append(reference.compressed_tokens(rows, ape, 4, HD).to(torch.float32))
        pos.append(torch.arange(per_req) * 4)
    x = torch.cat(toks)[:n_tokens].numpy()
    p = torch.cat(pos)[:n_tokens].numpy()
    freqs = reference.freqs_real(worlds.rope_table(4096)).numpy()
    return x, w.numpy().astype(F32), p, freqs[p], freqs


def op_rows(x, w, pos, freqs, eps, device="cpu", store_format="fp8_ds_mla"
            ) -> Dict[str, np.ndarray]:
    """dsv4_ops' kernel on `device` for tokens x [n, 512] at positions pos (one decode row
    each, slot t; freqs: the [max_pos, 64] table): {'data': [n, data bytes], 'scales': [n, 7]
    (fp8_ds_mla) or [n, 0]}."""
    import torch

    import dsv4_ops
    from dsv4_ops import ops

    n = x.shape[0]
    ps = 64
    fmt = dsv4_ops.STORE_FORMATS[store_format]
    pages = -(-n // ps)
    cache = torch.zeros(pages, dsv4_ops.cache_page_bytes(store_format, ps), dtype=torch.uint8,
                        device=device)
    words = torch.zeros(n, 4, dtype=torch.int32)
    words[:, 0] = torch.from_numpy(np.asarray(pos, dtype=np.int64) + 4).to(torch.int32)
    words[:, 1] = torch.arange(n, dtype=torch.int32)
    plan = words.view(torch.uint8).reshape(n, 16).to(device)
    ops.compress_norm_rope_store_op(
        torch.from_numpy(np.ascontiguousarray(x, dtype=F32)).to(device), plan,
        torch.from_numpy(np.ascontiguousarray(w, dtype=F32)).to(device),
        torch.from_numpy(np.ascontiguousarray(freqs, dtype=F32)).to(device),
        torch.arange(n, dtype=torch.int64, device=device), cache, True, 4, eps, ps, store_format)
    flat = cache.cpu().numpy()
    t = np.arange(n)
    page, off = t // ps, t % ps
    db = fmt.data_bytes
    data = flat[page[:, None], off[:, None] * db + np.arange(db)]
    scales = flat[page[:, None], db * ps + off[:, None] * fmt.scale_stride + np.arange(fmt.scale_bytes)]
    return {"data": data, "scales": scales}


# ---------------------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------------------
def _dec(rows):
    return decode(rows["data"], rows["scales"])


def rsqrt_sensitivity(x, w, f, eps, k: int = 2) -> Dict[str, int]:
    """Bytes of the reference model that an rsqrt within k ulps of the correctly rounded one can
    change: the union over cr-k .. cr+k of the fields that differ from cr's."""
    base = _dec(encode_rows(engine_y("reference", x, w, f, eps, rsqrt="cr")))
    rope = np.zeros(base["rope"].shape, dtype=bool)
    sc = np.zeros(base["scales"].shape, dtype=bool)
    codes = np.zeros(base["codes"].shape, dtype=bool)
    for d in range(-k, k + 1):
        if d == 0:
            continue
        o = _dec(encode_rows(engine_y("reference", x, w, f, eps, rsqrt=f"cr{d:+d}")))
        rope |= o["rope"] != base["rope"]
        sc |= o["scales"] != base["scales"]
        codes |= o["codes"] != base["codes"]
    return {"ulps": k, "rope_values": int(rope.sum()), "scale_bytes": int(sc.sum()),
            "codes": int(codes.sum()), "tokens": int((rope.any(1) | sc.any(1) | codes.any(1)).sum())}


def model_report(x, w, pos, f, eps, table: Optional[RsqrtTable] = None,
                 gpu: Optional[Dict[str, Dict[str, np.ndarray]]] = None) -> Dict[str, Any]:
    """ours / reference model / exact on the same tokens; gpu: the engines' real rows
    ({'dsv4': rows, 'sglang': rows}) where a dump provides them."""
    y64 = norm_rope64(x, w, f, eps)
    ours = _dec(encode_rows(engine_y("ours", x, w, f, eps)))
    ref_cr = _dec(encode_rows(engine_y("reference", x, w, f, eps, rsqrt="cr")))
    exact_rows = _dec(encode_rows(bf16_round64(y64).astype(F32)))  # one rounding, then exact
    rep: Dict[str, Any] = {"tokens": int(x.shape[0]), "eps": eps}
    rep["inv_accuracy"] = inv_accuracy(x, eps, table)
    rep["ours_vs_reference_cr"] = compare(ours, ref_cr, y64)
    rep["ours_vs_reference_cr"]["worst_rope"] = worst_rope(ours, ref_cr, y64, x, pos)
    # What-if: the lane order.
    lane = _dec(encode_rows(engine_y("ours", x, w, f, eps, order="lane")))
    rep["ours_with_lane_sum_vs_reference_cr"] = compare(lane, ref_cr, y64)
    rep["ours_vs_exact"] = compare(ours, exact_rows, y64)
    rep["reference_cr_vs_exact"] = compare(ref_cr, exact_rows, y64)
    rep["rsqrt_sensitivity"] = rsqrt_sensitivity(x, w, f, eps)
    rep["kv_rows_perturbed"] = perturbed_report(x, w, pos, f, eps)
    if table is not None:
        ref_t = _dec(encode_rows(engine_y("reference", x, w, f, eps, rsqrt="table", table=table)))
        rep["ours_vs_reference_table"] = compare(ours, ref_t, y64)
        rep["reference_table_vs_exact"] = compare(ref_t, exact_rows, y64)
        for order in SUMSQ:  # which (order, rsqrt) of ours would be nearest the hardware's
            for mode in ("div_sqrt", "cr"):
                alt = _dec(encode_rows(engine_y("ours", x, w, f, eps, order=order, rsqrt=mode)))
                rep[f"{order}_sum_{mode}_vs_reference_table"] = compare(alt, ref_t, y64)
    if gpu:
        g = {k: _dec(v) for k, v in gpu.items()}
        rep["gpu_dsv4_equals_ours_model"] = compare(g["dsv4"], ours)["tokens_diff"] == 0
        rep["gpu_dsv4_vs_gpu_sglang"] = compare(g["dsv4"], g["sglang"], y64)
        rep["gpu_dsv4_vs_gpu_sglang"]["worst_rope"] = worst_rope(g["dsv4"], g["sglang"], y64, x, pos)
        rep["reference_cr_vs_gpu_sglang"] = compare(ref_cr, g["sglang"], y64)
        if table is not None:
            rep["reference_table_vs_gpu_sglang"] = compare(ref_t, g["sglang"], y64)
    return rep


def load_dump(path: str):
    z = np.load(path)
    x = z["kv"].astype(F32)
    f = z["freqs"].astype(F32)[z["pos"]]
    gpu = {"dsv4": {"data": z["dsv4_data"], "scales": z["dsv4_scales"][:, :7]},
           "sglang": {"data": z["sglang_data"], "scales": z["sglang_scales"][:, :7]}}
    return x, z["norm_weight"].astype(F32), z["pos"], f, float(z["eps"]), gpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=10240,
                    help="harness-like tokens (default: p8x4096's 8192 + p4x2000+2048's 2048)")
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--eps", type=float, default=1e-6)
    ap.add_argument("--dump", default=None, help="folder of peer_store_match.py's files")
    ap.add_argument("--rsqrt-table", default=None,
                    help="rsqrt_table.npz of peer_store_match.py (default: DUMP/rsqrt_table.npz)")
    ap.add_argument("--no-cpu-op", action="store_true", help="skip the CPU-op self-check")
    ap.add_argument("--json", default=None, help="write the report here")
    args = ap.parse_args(argv)
    tpath = args.rsqrt_table or (os.path.join(args.dump, "rsqrt_table.npz") if args.dump else None)
    table = RsqrtTable(tpath) if tpath and os.path.exists(tpath) else None
    report: Dict[str, Any] = {"rsqrt_table": tpath if table is not None else None}
    if table is not None:
        report["rsqrt_table_meta"] = table.meta
    if args.dump:
        for path in sorted(glob.glob(os.path.join(args.dump, "store_dump_*.npz"))):
            x, w, pos, f, eps, gpu = load_dump(path)
            report[os.path.basename(path)] = model_report(x, w, pos, f, eps, table, gpu)
    else:
        x, w, pos, f, freqs = harness_like_tokens(args.tokens, args.seed)
        if not args.no_cpu_op:
            cpu = _dec(op_rows(x, w, pos, freqs, args.eps))
            mine = _dec(encode_rows(engine_y("ours", x, w, f, args.eps)))
            report["cpu_op_equals_ours_model"] = compare(cpu, mine)["tokens_diff"] == 0
        report["harness_like"] = model_report(x, w, pos, f, args.eps, table)
        report["constructed"] = constructed_report(args.eps)
    text = json.dumps(report, indent=1, default=str)
    print(text)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(text + "\n")
    ok = report.get("cpu_op_equals_ours_model", True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
