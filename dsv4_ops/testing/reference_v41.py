"""The V4.1 test oracle: contract V4.1 sections 1 and 3 in plain PyTorch, from whole sequences.

Ratio-2 pairs are pooled from the full sequence of one request's kv_score rows (positions
0..L-1), with no ring: a kernel that parks, reloads or pairs rows wrongly disagrees with it.
Pooling and normalisation run in float64 (as the V4.0 oracle, `reference`); the quantisers use
torch's own bf16 / float8 conversions and the V4.0 oracle's e4m3, UE8M0 and RoPE helpers.
"""
from typing import Tuple

import torch

from ..layout import STORE_FORMATS, KVLayout, cache_page_bytes, token_byte_offsets
from .reference import FP4_MAX, FP8_MAX, SCALE_FLOOR, _pow2, e4m3_codes, encode, rope, ue8m0_ceil

HEAD_DIM = 512
ROPE_FIRST = HEAD_DIM - 64          # the latent's RoPE dims: 448..511
INDEX_DIM = 128
INDEX_ROPE_FIRST = 64               # index-K RoPE dims: 64..127
FAKE_QUANT_BLOCK = 16
INDEX_QUANT_BLOCK = 32
E4M3_SCALE_MIN = 2.0 ** -9
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_TIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_ONE_SIXTH = torch.tensor(1.0 / 6.0, dtype=torch.float32)  # fp32(1/6), a multiplier
INDEX_K_FORMAT = STORE_FORMATS["fp4_indexer"]               # 64 B of codes + 4 exponent bytes


def bf16(x: torch.Tensor) -> torch.Tensor:
    """x rounded to nearest even bf16, as float32."""
    return x.to(torch.bfloat16).to(torch.float32)


# ---------------------------------------------------------------------------------------
# Latents (contract V4.1 1.2 - 1.4)
# ---------------------------------------------------------------------------------------
def pair_pool(kv_score: torch.Tensor) -> torch.Tensor:
    """Pooled pairs (2g, 2g+1) of one request's rows kv_score [L, 1024] = kv | score:
    float64 [L // 2, 512], w = softmax([score_even, score_odd]) per channel."""
    x = kv_score.to(torch.float64)
    n = x.shape[0] // 2
    rows = x[: 2 * n].reshape(n, 2, 2 * HEAD_DIM)
    weights = torch.softmax(rows[..., HEAD_DIM:], dim=1)
    return (weights * rows[..., :HEAD_DIM]).sum(dim=1)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """bf16(x * rsqrt(mean(x^2) + eps) * w) over the last dim, x being bf16 values: float64
    math, rounded to the contract's fp32 result and then to bf16."""
    y = x.to(torch.float64)
    y = y * torch.rsqrt(y.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.to(torch.float64)
    return y.to(torch.float32).to(torch.bfloat16)


def group_positions(ratio: int, positions: torch.Tensor) -> torch.Tensor:
    """The position a compressed token stands for: pos & ~(ratio - 1)."""
    return positions.to(torch.int64) & ~(ratio - 1)


def latents(rows: torch.Tensor, ratio: int, norm_weight: torch.Tensor, eps: float
            ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(latent bf16 [n, 512], pos int64 [n]): the published pre-RoPE, post-norm latents of one
    request's whole sequence and the positions of the rows that write them. Ratio 1: rows is
    kv bf16 [L, 512], one latent per row. Ratio 2: rows is kv_score fp32 [L, 1024], one latent
    per odd position, from bf16(pooled pair)."""
    if ratio == 1:
        return rms_norm(rows, norm_weight, eps), torch.arange(rows.shape[0])
    if ratio == 2:
        # the contract pools in fp32: the fp64 value rounded to fp32 first, so that an fp32
        # result on a bf16 tie rounds as the kernels' does
        pooled = pair_pool(rows).to(torch.float32).to(torch.bfloat16)
        return rms_norm(pooled, norm_weight, eps), torch.arange(1, 2 * pooled.shape[0], 2)
    raise ValueError(f"reference_v41.latents: ratio must be 1 or 2, got {ratio!r}")


def rope_latent(latent: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor,
                first_dim: int = ROPE_FIRST) -> torch.Tensor:
    """float32 [n, d]: latent with the 64 dims from first_dim rotated at `positions` (the RoPE
    positions, already the group's) and rounded to bf16; the other dims unchanged."""
    return bf16(rope(latent.to(torch.float64), positions, freqs, first_dim).to(torch.float32))


# ---------------------------------------------------------------------------------------
# FP4 grids (contract V4.1 1.6, 1.8, 3.3)
# ---------------------------------------------------------------------------------------
def e2m1_index(v: torch.Tensor) -> torch.Tensor:
    """Magnitude index (0..7 into E2M1_GRID) of |v| rounded to nearest, ties to the even
    index, saturating at 6 (int64)."""
    a = v.abs().to(torch.float32).clamp(max=FP4_MAX)
    ties = torch.tensor(_E2M1_TIES, dtype=torch.float32, device=v.device)
    below = torch.bucketize(a, ties, right=False)      # midpoints strictly below a
    tie = (below < len(_E2M1_TIES)) & (a == ties[below.clamp(max=len(_E2M1_TIES) - 1)])
    return below + (tie & (below % 2 == 1)).to(below.dtype)


def e2m1_value(index: torch.Tensor) -> torch.Tensor:
    return torch.tensor(E2M1_GRID, dtype=torch.float32, device=index.device)[index]


def _blocks(v: torch.Tensor, size: int) -> torch.Tensor:
    return v.to(torch.float32).reshape(v.shape[0], -1, size)


def fp4_fake_quant(v: torch.Tensor) -> torch.Tensor:
    """contract V4.1 1.6: rows v [n, 512] (fp32 values of bf16 numbers) onto the e2m1 x e4m3
    grid per 16 dims, float32. A negative non-zero v / s that rounds to 0 gives -0.0; an exact
    +-0 gives +0."""
    x = _blocks(v, FAKE_QUANT_BLOCK)
    amax = x.abs().amax(dim=-1, keepdim=True)
    s = (amax * _ONE_SIXTH).clamp(E4M3_SCALE_MIN, FP8_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    t = x / s
    mag = e2m1_value(e2m1_index(t))
    # -0 < 0 is false: an exact -0 input takes +0, as t + 0.0 does in the contract
    return (torch.where(t < 0, -mag, mag) * s).reshape(v.shape)


# ---------------------------------------------------------------------------------------
# Layout encodings (contract V4.1 3.2 - 3.4) and the cache
# ---------------------------------------------------------------------------------------
def _pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Dim 2k in bits 0..3 of byte k, dim 2k+1 in bits 4..7."""
    codes = codes.to(torch.uint8)
    return codes[:, 0::2] | (codes[:, 1::2] << 4)


def _unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(packed.shape[0], -1)


def encode_layout(y: torch.Tensor, layout) -> Tuple[torch.Tensor, torch.Tensor]:
    """(data uint8 [n, data_bytes], scales uint8 [n, scales_written]) of rows y [n, 512]
    (float32) in the row encoding of `layout`."""
    enc = KVLayout.parse(layout).encoding
    y = y.to(torch.float32)
    n = y.shape[0]
    if enc is KVLayout.V4:
        return encode(y, "fp8_ds_mla")
    if enc is KVLayout.UNIFORM_FP8:
        return e4m3_codes(y), y.new_zeros((n, 0), dtype=torch.uint8)
    x = _blocks(y, enc.tile_size)
    amax = x.abs().amax(dim=-1)
    if enc is KVLayout.V41:
        e = ue8m0_ceil((amax / FP8_MAX).clamp(min=SCALE_FLOOR))
        return e4m3_codes((x * _pow2(127 - e)[..., None]).reshape(n, -1)), e.to(torch.uint8)
    s8 = e4m3_codes((amax / FP4_MAX).clamp(E4M3_SCALE_MIN, FP8_MAX))     # V41_FP4
    s = s8.view(torch.float8_e4m3fn).to(torch.float32)
    t = (x / s[..., None]).reshape(n, -1)
    codes = e2m1_index(t) | (torch.signbit(y).to(torch.int64) << 3)
    return _pack_nibbles(codes), s8


def decode_layout(data: torch.Tensor, scales: torch.Tensor, layout) -> torch.Tensor:
    """float32 [n, 512]: the values that encode_layout's bytes stand for."""
    enc = KVLayout.parse(layout).encoding
    n = data.shape[0]
    if enc is KVLayout.V4:
        e = scales[:, :7].to(torch.int32)
        codes = data[:, :448].contiguous().view(torch.float8_e4m3fn).to(torch.float32)
        nope = (codes.reshape(n, 7, 64) * _pow2(e - 127)[..., None]).reshape(n, 448)
        tail = data[:, 448:].contiguous().view(torch.bfloat16).to(torch.float32)
        return torch.cat([nope, tail], dim=1)
    if enc is KVLayout.UNIFORM_FP8:
        return data.contiguous().view(torch.float8_e4m3fn).to(torch.float32)
    if enc is KVLayout.V41:
        codes = data.contiguous().view(torch.float8_e4m3fn).to(torch.float32)
        scale = _pow2(scales.to(torch.int32) - 127)
    else:
        nib = _unpack_nibbles(data).to(torch.int64)
        mag = e2m1_value(nib & 7)
        codes = torch.where((nib & 8) != 0, -mag, mag)
        scale = scales.contiguous().view(torch.float8_e4m3fn).to(torch.float32)
    return (_blocks(codes, enc.tile_size) * scale[..., None]).reshape(n, -1)


def stored_value(rotated: torch.Tensor, layout) -> torch.Tensor:
    """contract V4.1 1.7: the value a layout stores of a rotated latent row: fp4 fake quantised
    before the fp8-style layouts, as is for the V41_FP4 ones."""
    return rotated if KVLayout.parse(layout).is_fp4 else fp4_fake_quant(rotated)


def _flat_cache(kvcache: torch.Tensor) -> torch.Tensor:
    if kvcache.dtype == torch.float8_e4m3fn:
        kvcache = kvcache.view(torch.uint8)
    return kvcache.view(-1)


def _scatter(flat: torch.Tensor, offsets: torch.Tensor, values: torch.Tensor) -> None:
    if values.shape[1]:
        flat[offsets[:, None] + torch.arange(values.shape[1], device=flat.device)] = values


def store_rows(kvcache: torch.Tensor, y: torch.Tensor, locs: torch.Tensor, layout,
               page_size: int) -> None:
    """Encode rows y [n, 512] in `layout` and write them to slots locs of kvcache
    ([pages, page_bytes] uint8 or float8_e4m3fn); slots <= 0 are skipped."""
    layout = KVLayout.parse(layout)
    locs = locs.to(torch.int64)
    keep = locs > 0
    data, scales = encode_layout(y[keep], layout)
    flat = _flat_cache(kvcache)
    data_at, scales_at = layout.token_offsets(locs[keep], page_size)
    _scatter(flat, data_at, data)
    _scatter(flat, scales_at, scales)


def read_rows(kvcache: torch.Tensor, locs: torch.Tensor, layout, page_size: int
              ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(data, scales) bytes of slots locs of kvcache in `layout` (the written scale bytes)."""
    layout = KVLayout.parse(layout)
    flat = _flat_cache(kvcache)
    data_at, scales_at = layout.token_offsets(locs.to(torch.int64), page_size)
    cols_d = torch.arange(layout.data_bytes)
    cols_s = torch.arange(layout.scales_written)
    return flat[data_at[:, None] + cols_d], flat[scales_at[:, None] + cols_s]


def low_ratio_store(kvcache: torch.Tensor, rows: torch.Tensor, ratio: int,
                    norm_weight: torch.Tensor, eps: float, freqs: torch.Tensor,
                    raw_out_loc: torch.Tensor, layout, page_size: int
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """One request's whole sequence (rows of positions 0..L-1, raw_out_loc [L] its FULL-pool
    slots) through contract V4.1 1.2 - 1.7: returns (latent bf16 [n, 512], pos [n]) as `latents`,
    and stores each latent, rotated at its group position, at slot raw_out_loc // ratio of
    kvcache when raw_out_loc > 0."""
    latent, pos = latents(rows, ratio, norm_weight, eps)
    rotated = rope_latent(latent, group_positions(ratio, pos), freqs)
    raw = raw_out_loc.to(torch.int64)[pos]
    locs = torch.where(raw > 0, raw // ratio, torch.full_like(raw, -1))
    store_rows(kvcache, stored_value(rotated, layout), locs, layout, page_size)
    return latent, pos


# ---------------------------------------------------------------------------------------
# Low-ratio index-K (contract V4.1 1.8)
# ---------------------------------------------------------------------------------------
def low_ratio_out_loc(ratio: int, positions: torch.Tensor, raw_out_loc: torch.Tensor
                      ) -> torch.Tensor:
    """raw_out_loc // ratio where (pos + 1) % ratio == 0, else -1 (int64)."""
    pos, raw = positions.to(torch.int64), raw_out_loc.to(torch.int64)
    return torch.where((pos + 1) % ratio == 0, raw // ratio, torch.full_like(raw, -1))


def _index_stage1(k: torch.Tensor) -> torch.Tensor:
    """Fake quant per 32: UE8M0 scale 2^ceil(log2(max(amax, 6 * 2^-126) * fp32(1/6)))."""
    x = _blocks(k, INDEX_QUANT_BLOCK)
    amax = x.abs().amax(dim=-1, keepdim=True)
    sc = _pow2(ue8m0_ceil(amax.clamp(min=FP4_MAX * 2.0 ** -126) * _ONE_SIXTH) - 127)
    t = (x / sc).clamp(-FP4_MAX, FP4_MAX)
    mag = e2m1_value(e2m1_index(t))
    return (torch.where(t < 0, -mag, mag) * sc).reshape(k.shape)


def index_k(k: torch.Tensor, norm_weight: torch.Tensor, eps: float, freqs: torch.Tensor,
            positions: torch.Tensor, ratio: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(codes uint8 [n, 64], exponents uint8 [n, 4]) of index keys k = wk(latent), bf16
    [n, 128], at token positions `positions`: RMSNorm, RoPE of dims 64..127 at the group
    position, the stage-1 fake quant and the stage-2 packer (no sign on zero magnitudes)."""
    normed = rms_norm(k, norm_weight, eps)
    rotated = rope_latent(normed, group_positions(ratio, positions), freqs, INDEX_ROPE_FIRST)
    q = _blocks(_index_stage1(rotated), INDEX_QUANT_BLOCK)
    amax_q = q.abs().amax(dim=-1)
    e = ue8m0_ceil((amax_q / FP4_MAX).clamp(min=SCALE_FLOOR)).clamp(1, 254)
    t = (q * _pow2(127 - e)[..., None]).reshape(k.shape[0], -1)
    idx = e2m1_index(t)
    codes = idx | (((t < 0) & (idx != 0)).to(torch.int64) << 3)
    return _pack_nibbles(codes), e.to(torch.uint8)


def index_k_store(cache: torch.Tensor, k: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                  freqs: torch.Tensor, positions: torch.Tensor, loc: torch.Tensor, ratio: int,
                  page_size: int) -> None:
    """index_k of the rows whose loc > 0, written to cache [pages, 68 * page_size] uint8:
    codes at page * 68ps + off * 64, exponents at page * 68ps + 64ps + off * 4."""
    loc = loc.to(torch.int64)
    keep = loc > 0
    codes, exps = index_k(k[keep], norm_weight, eps, freqs, positions[keep], ratio)
    fmt = INDEX_K_FORMAT
    page_bytes = cache_page_bytes("fp4_indexer", page_size)
    data_at, scales_at = token_byte_offsets(loc[keep], page_size, fmt.data_bytes,
                                            fmt.scale_stride, page_bytes)
    flat = _flat_cache(cache)
    _scatter(flat, data_at, codes)
    _scatter(flat, scales_at, exps)
