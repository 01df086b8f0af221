"""The test oracle: docs/contract.md section 1 in plain PyTorch, computed from whole sequences.

Nothing here knows about plans, state buffers, rings or pages except the final cache scatter:
a compressed token is computed from the full sequence of kv_score rows of its request, so a
kernel that persists, reloads or merges state wrongly disagrees with it. Pooling and
normalisation run in float64; quantisation uses torch's own bf16 / float8 conversions, so the
encoder is independent of the bit-level code in csrc/include/dsv4/numerics.h.
"""
import functools
from typing import Tuple

import torch

from ..layout import STORE_FORMATS, kv_score_row_width, window_size

ROPE_DIM = 64
FP8_MAX = 448.0
FP4_MAX = 6.0
SCALE_FLOOR = 1e-4
FP4_THRESHOLDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)

# ---------------------------------------------------------------------------------------
# Pooling (docs/contract.md 1.2) and the online running state (contract 3.5)
# ---------------------------------------------------------------------------------------
def compressed_tokens(kv_score: torch.Tensor, ape: torch.Tensor, compress_ratio: int,
                      head_dim: int) -> torch.Tensor:
    """All compressed tokens of one request whose kv_score rows are kv_score[0:L]:
    [L // cr, hd] float64, token k closing at s = (k+1) * cr."""
    hd, cr = head_dim, compress_ratio
    x = kv_score.to(torch.float64)
    a = ape.to(torch.float64).reshape(window_size(cr), hd)
    n = x.shape[0] // cr
    rows = x[: n * cr].reshape(n, cr, kv_score_row_width(cr, hd))
    if cr == 128:
        kv, score = rows[..., :hd], rows[..., hd:]
    else:
        # Window k = previous window's overlap quarters (absent for k = 0) + own quarters.
        kv_ovl, kv_cur = rows[..., :hd], rows[..., hd:2 * hd]
        sc_ovl, sc_cur = rows[..., 2 * hd:3 * hd], rows[..., 3 * hd:]
        absent_kv = torch.zeros_like(kv_ovl[:1])
        absent_sc = torch.full_like(sc_ovl[:1], float("-inf"))
        kv = torch.cat([torch.cat([absent_kv, kv_ovl[:-1]]), kv_cur], dim=1)
        score = torch.cat([torch.cat([absent_sc, sc_ovl[:-1]]), sc_cur], dim=1)
    weights = torch.softmax(score + a, dim=1)
    return (weights * kv).sum(dim=1)


def online_state(kv_score: torch.Tensor, ape: torch.Tensor, head_dim: int
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(m, S, K), each [hd] float64: running max, sum of exp and normalised weighted kv over
    the tokens of the chunk that holds token L-1 (L = kv_score rows, L >= 1)."""
    hd = head_dim
    x = kv_score.to(torch.float64)
    length = x.shape[0]
    start = (length - 1) // 128 * 128
    z = x[start:, hd:2 * hd] + ape.to(torch.float64).reshape(128, hd)[: length - start]
    m = z.max(dim=0).values
    e = torch.exp(z - m)
    s = e.sum(dim=0)
    k = (e * x[start:, :hd]).sum(dim=0) / s
    return m, s, k


# ---------------------------------------------------------------------------------------
# RMSNorm, RoPE, Hadamard (contract 1.3)
# ---------------------------------------------------------------------------------------
def freqs_real(freqs: torch.Tensor) -> torch.Tensor:
    """fp32 [max_pos, 64] (cos0, sin0, cos1, sin1, ...) from either that or complex [max_pos, 32]."""
    if freqs.is_complex():
        return torch.view_as_real(freqs).reshape(freqs.shape[0], -1)
    return freqs


@functools.lru_cache(maxsize=None)
def hadamard_matrix(n: int, dtype=torch.float64) -> torch.Tensor:
    """Sylvester-ordered Walsh-Hadamard matrix: H[i, j] = (-1)^popcount(i & j) (cached:
    norm_rope calls it per store). Callers must not modify it in place."""
    idx = torch.arange(n)
    bits = torch.bitwise_and(idx[:, None], idx[None, :])
    parity = torch.zeros_like(bits)
    while bool((bits != 0).any()):
        parity ^= bits & 1
        bits = bits >> 1
    return (1 - 2 * parity).to(dtype)


def rope(y: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, first_dim: int
         ) -> torch.Tensor:
    """y (float64 [n, d]) with the 64 dims from first_dim rotated as interleaved pairs
    (first_dim + 2k, first_dim + 2k + 1) by freqs[positions][k]; a new tensor."""
    f = freqs_real(freqs).to(torch.float64)[positions.to(torch.int64)]
    cos, sin = f[:, 0::2], f[:, 1::2]
    re, im = y[:, first_dim:first_dim + ROPE_DIM:2], y[:, first_dim + 1:first_dim + ROPE_DIM:2]
    y = y.clone()
    y[:, first_dim:first_dim + ROPE_DIM:2] = re * cos - im * sin
    y[:, first_dim + 1:first_dim + ROPE_DIM:2] = re * sin + im * cos
    return y


def norm_rope(x: torch.Tensor, positions: torch.Tensor, norm_weight: torch.Tensor, eps: float,
              freqs: torch.Tensor) -> torch.Tensor:
    """RMSNorm over hd, RoPE on the last 64 dims at `positions`, Hadamard when hd == 128.
    Returns float32 [n, hd]."""
    y = x.to(torch.float64)
    hd = y.shape[-1]
    y = y * torch.rsqrt(y.pow(2).mean(dim=-1, keepdim=True) + eps) * norm_weight.to(torch.float64)
    y = rope(y, positions, freqs, hd - ROPE_DIM)
    if hd == 128:
        y = y @ hadamard_matrix(128).to(y.device) / 128 ** 0.5
    return y.to(torch.float32)


# ---------------------------------------------------------------------------------------
# Quantised cache formats (contract 4)
# ---------------------------------------------------------------------------------------
def ue8m0_ceil(v: torch.Tensor) -> torch.Tensor:
    """Biased exponent of the smallest power of two >= v (fp32, v > 0), as int32."""
    mant, exp = torch.frexp(v.to(torch.float32))  # v = mant * 2^exp, mant in [0.5, 1)
    return (exp + 126 + (mant != 0.5).to(torch.int32)).to(torch.int32)


def _pow2(e: torch.Tensor) -> torch.Tensor:
    return torch.ldexp(torch.ones_like(e, dtype=torch.float32), e.to(torch.float32))


def e4m3_codes(x: torch.Tensor) -> torch.Tensor:
    """Saturating round-to-nearest-even e4m3fn codes (uint8) of float32 values."""
    return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """e2m1 nibbles: magnitude index = thresholds strictly below min(|v|, 6); sign if v < 0."""
    bounds = torch.tensor(FP4_THRESHOLDS, dtype=torch.float32, device=v.device)
    idx = torch.bucketize(v.abs().clamp(max=FP4_MAX), bounds, right=False).to(torch.uint8)
    sign = ((v < 0) & (idx != 0)).to(torch.uint8) * 8
    return idx | sign


def _group_scale_exponents(y: torch.Tensor, group: int, fmt_max: float) -> torch.Tensor:
    amax = y.reshape(y.shape[0], -1, group).abs().amax(dim=-1)
    return ue8m0_ceil(amax.clamp(min=SCALE_FLOOR) / fmt_max)


def encode(y: torch.Tensor, store_format: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """(data uint8 [n, data_bytes], scales uint8 [n, scale_bytes]) of float32 tokens y."""
    y = y.to(torch.float32)
    n = y.shape[0]
    if store_format == "fp8_ds_mla":
        yb = y.to(torch.bfloat16).to(torch.float32)
        e = _group_scale_exponents(yb[:, :448], 64, FP8_MAX)           # [n, 7]
        scaled = yb[:, :448].reshape(n, 7, 64) * _pow2(127 - e)[..., None]
        codes = e4m3_codes(scaled.reshape(n, 448))
        rope = y[:, 448:].to(torch.bfloat16).contiguous().view(torch.uint8)  # [n, 128]
        return torch.cat([codes, rope], dim=1), e.to(torch.uint8)
    if store_format == "bf16":
        return y.to(torch.bfloat16).contiguous().view(torch.uint8), y.new_zeros((n, 0), dtype=torch.uint8)
    if store_format == "fp8_indexer":
        scale = y.abs().amax(dim=-1, keepdim=True).clamp(min=SCALE_FLOOR) / FP8_MAX
        codes = e4m3_codes(y / scale)
        return codes, scale.contiguous().view(torch.uint8)
    if store_format == "fp4_indexer":
        e = _group_scale_exponents(y, 32, FP4_MAX)                      # [n, 4]
        nib = e2m1_codes((y.reshape(n, 4, 32) * _pow2(127 - e)[..., None]).reshape(n, 128))
        packed = nib[:, 0::2] | (nib[:, 1::2] << 4)
        return packed, e.to(torch.uint8)
    raise ValueError(f"unknown store format {store_format!r}")


def store(kvcache: torch.Tensor, kv: torch.Tensor, positions: torch.Tensor, locs: torch.Tensor,
          norm_weight: torch.Tensor, eps: float, freqs: torch.Tensor, store_format: str,
          page_size: int) -> None:
    """Normalise, rotate, encode and scatter tokens into kvcache (uint8 [pages, page_bytes]).
    Tokens whose loc is negative or past the cache are skipped."""
    if kv.shape[0] == 0:
        return
    _, data_bytes, scale_bytes, scale_stride = STORE_FORMATS[store_format]
    data, scales = encode(norm_rope(kv, positions, norm_weight, eps, freqs), store_format)
    cache = kvcache.view(kvcache.shape[0], -1)
    locs = locs.to(torch.int64).to(cache.device)
    keep = (locs >= 0) & (locs < cache.shape[0] * page_size)
    locs, data, scales = locs[keep], data.to(cache.device)[keep], scales.to(cache.device)[keep]
    page, off = locs // page_size, locs % page_size
    cols = off[:, None] * data_bytes + torch.arange(data_bytes, device=cache.device)
    cache[page[:, None], cols] = data
    if scale_bytes:
        cols = page_size * data_bytes + off[:, None] * scale_stride + torch.arange(
            scale_bytes, device=cache.device)
        cache[page[:, None], cols] = scales


# ---------------------------------------------------------------------------------------
# State addressing (contract 2.1), for tests that inspect state buffers
# ---------------------------------------------------------------------------------------
def state_slot(addressing: str, rid: int, pos: int, *, compress_ratio: int, ring_size: int = 0,
               swa_page_size: int = 0, req_to_token=None, full_to_state=None,
               state_slot_offset: int = 0) -> int:
    """Slot of (request row rid, position pos): addressing in
    {"swa_paged", "req_ring", "legacy", "online"}; -1 for an evicted SWA token."""
    if addressing == "swa_paged":
        swa = int(full_to_state[int(req_to_token[rid, pos])])
        if swa < 0:
            return -1
        return (swa // swa_page_size) * ring_size + swa % ring_size
    if addressing == "req_ring":
        return rid * ring_size + pos % ring_size
    if addressing == "legacy":
        win = window_size(compress_ratio)
        return rid * win + pos % win
    if addressing == "online":
        return rid + state_slot_offset
    raise ValueError(f"unknown addressing {addressing!r}")
