"""The reference engine's V4.1 ratio-1 / ratio-2 compressor API (contract V4.1 4.3): the same
positional and keyword signatures as its `low_ratio_compress`, `attn.fused_store_cache` and
`fp4_indexer_rope.index_k_norm_rope_pack_store`, so engine code runs on dsv4_ops by changing
one import. The kernel wrappers return the pre-RoPE latent (`out`, allocated when None; the ops
leave the rows they do not write as they were).

Every store also takes `dcp_world_size=1, dcp_rank=0, dcp_interleave=1` (keywords, contract 9):
the cache slots are global entries, and this rank stores only those it owns, each at its local
slot (`dsv4_ops.dcp_local_slot`); the latents (`out`) and the pair-state ring are written on
every rank.

`freqs_cis` is the layer's RoPE table, complex [max_pos, 32] or its real view fp32
[max_pos, 64]. No autograd: run under torch.no_grad() or torch.inference_mode()."""
from typing import Optional, Union

import torch

from . import ops
from .compressor import freqs_as_real
from .layout import INDEX_K_SLOT_BYTES, KVLayout

Layout = Union[KVLayout, str]


def _layout(fn: str, layout: Layout) -> str:
    try:
        return KVLayout.parse(layout).value
    except ValueError as err:
        raise ValueError(f"dsv4.{fn}: layout must be one of "
                         f"{', '.join(m.value for m in KVLayout)}, got {layout!r}") from err


def _dcp(world_size, rank, interleave) -> dict:
    return {"dcp_world_size": int(world_size), "dcp_rank": int(rank),
            "dcp_interleave": int(interleave)}


def _latent(fn: str, rows: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
    if out is not None:
        return out
    if rows.dim() != 2:
        raise ValueError(f"dsv4.{fn}: the input must be 2-D [num_tokens, dim], got shape "
                         f"{tuple(rows.shape)}")
    return torch.empty((rows.shape[0], KVLayout.V4.head_dim), dtype=torch.bfloat16,
                       device=rows.device)


def c1_decode_norm_rope_store(kv_input: torch.Tensor, norm_weight: torch.Tensor,
                              positions: torch.Tensor, out_loc: torch.Tensor, eps: float,
                              freqs_cis: torch.Tensor, k_cache: torch.Tensor, *, page_size: int,
                              layout: Layout = KVLayout.V4,
                              out: Optional[torch.Tensor] = None, dcp_world_size: int = 1,
                              dcp_rank: int = 0, dcp_interleave: int = 1) -> torch.Tensor:
    """Ratio 1 (decode, verify and extend alike): the latent of every bf16 kv row (padded rows
    too) into `out` [N, 512]; rows with out_loc > 0 rotated at pos and stored at out_loc of
    k_cache (page_size slots a page, in `layout`). Returns `out`."""
    fn = "c1_decode_norm_rope_store"
    latent = _latent(fn, kv_input, out)
    ops.c1_norm_rope_store_op(kv_input, norm_weight, float(eps), freqs_as_real(freqs_cis),
                              positions, out_loc, k_cache, int(page_size), _layout(fn, layout),
                              latent, **_dcp(dcp_world_size, dcp_rank, dcp_interleave))
    return latent


def c2_decode_norm_rope_store(kv_input: torch.Tensor, kv_state: torch.Tensor,
                              norm_weight: torch.Tensor, positions: torch.Tensor,
                              req: torch.Tensor, raw_out_loc: torch.Tensor, eps: float,
                              freqs_cis: torch.Tensor, k_cache: torch.Tensor, *, page_size: int,
                              ring_size: int, draft_len: int = 1,
                              layout: Layout = KVLayout.V4,
                              out: Optional[torch.Tensor] = None, dcp_world_size: int = 1,
                              dcp_rank: int = 0, dcp_interleave: int = 1) -> torch.Tensor:
    """Ratio 2, decode (draft_len 1) or verify (N = B * draft_len rows, each block draft_len
    consecutive positions of one request; ring_size > draft_len). kv_input is fp32 kv | score
    [N, 1024], kv_state the pair-state ring [rows, 1024]. Even live rows park in the ring, odd
    live rows write their latent and store at raw_out_loc >> 1; rows with raw_out_loc <= 0
    write nothing. Returns `out` (only odd live rows written)."""
    fn = "c2_decode_norm_rope_store"
    latent = _latent(fn, kv_input, out)
    ops.c2_norm_rope_store_op(kv_input, kv_state, norm_weight, float(eps),
                              freqs_as_real(freqs_cis), positions, req, raw_out_loc, k_cache,
                              int(page_size), int(ring_size), int(draft_len),
                              _layout(fn, layout), latent,
                              **_dcp(dcp_world_size, dcp_rank, dcp_interleave))
    return latent


def c2_prefill_norm_rope_store(kv_input: torch.Tensor, kv_state: torch.Tensor,
                               norm_weight: torch.Tensor, positions: torch.Tensor,
                               req: torch.Tensor, raw_out_loc: torch.Tensor, eps: float,
                               freqs_cis: torch.Tensor, k_cache: torch.Tensor,
                               extend_start_loc: torch.Tensor, extend_seq_lens: torch.Tensor, *,
                               page_size: int, ring_size: int, layout: Layout = KVLayout.V4,
                               out: Optional[torch.Tensor] = None, dcp_world_size: int = 1,
                               dcp_rank: int = 0, dcp_interleave: int = 1) -> torch.Tensor:
    """Ratio 2, extend: request i owns rows [extend_start_loc[i], + extend_seq_lens[i]) (int32).
    An odd live row pairs with the previous row when that is the same request's live position
    pos - 1, else with its ring slot; afterwards each request parks its last min(len, ring_size)
    live rows. Returns `out` (only odd live rows written)."""
    fn = "c2_prefill_norm_rope_store"
    latent = _latent(fn, kv_input, out)
    ops.c2_prefill_norm_rope_store_op(kv_input, kv_state, norm_weight, float(eps),
                                      freqs_as_real(freqs_cis), positions, req, raw_out_loc,
                                      extend_start_loc, extend_seq_lens, k_cache,
                                      int(page_size), int(ring_size), _layout(fn, layout),
                                      latent, **_dcp(dcp_world_size, dcp_rank, dcp_interleave))
    return latent


def fused_store_cache(input: torch.Tensor, cache: torch.Tensor, indices: torch.Tensor, *,
                      page_size: int, type: str = "flashmla", layout: Layout = KVLayout.V4,
                      freqs_cis: Optional[torch.Tensor] = None, dcp_world_size: int = 1,
                      dcp_rank: int = 0, dcp_interleave: int = 1) -> None:
    """Encode rows `input` (bf16 / fp32 [N, 512]) into the paged cache at `indices` (rows with
    indices < 0 write nothing). freqs_cis (V41 layouts only), one row per token ([N, 32]
    complex or [N, 64] fp32), rotates dims 448..511 in-kernel; without it the rows must be
    rotated already. Only type "flashmla" (the 512-dim KV cache)."""
    fn = "fused_store_cache"
    if type != "flashmla":
        raise ValueError(f"dsv4.{fn}: type must be 'flashmla' (the 512-dim KV cache), got "
                         f"{type!r}")
    freqs_rows = None if freqs_cis is None else freqs_as_real(freqs_cis)
    ops.kv_store_op(input, indices, freqs_rows, cache, int(page_size), _layout(fn, layout),
                    **_dcp(dcp_world_size, dcp_rank, dcp_interleave))


def index_k_norm_rope_pack_store(input: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                                 freqs_cis: torch.Tensor, positions: torch.Tensor,
                                 loc: torch.Tensor, cache: torch.Tensor, *, ratio: int,
                                 dcp_world_size: int = 1, dcp_rank: int = 0,
                                 dcp_interleave: int = 1) -> None:
    """Low-ratio index keys (bf16 [N, 128], wk(latent) before k_norm): RMSNorm, RoPE of dims
    64..127 at pos & ~(ratio - 1), two-stage fp4 into the index-K cache [pages, 68 * page_size]
    uint8 at loc (rows with loc <= 0 write nothing)."""
    if cache.dim() != 2:
        raise ValueError(f"dsv4.index_k_norm_rope_pack_store: cache must be 2-D [pages, "
                         f"{INDEX_K_SLOT_BYTES} * page_size], got shape {tuple(cache.shape)}")
    ops.low_ratio_index_k_store_op(input, norm_weight, float(eps), freqs_as_real(freqs_cis),
                                   positions, loc, cache, cache.shape[1] // INDEX_K_SLOT_BYTES,
                                   int(ratio), **_dcp(dcp_world_size, dcp_rank, dcp_interleave))


def low_ratio_out_loc(ratio: int, positions: torch.Tensor, raw_out_loc: torch.Tensor
                      ) -> torch.Tensor:
    """The compressed slot of each token, raw_out_loc // ratio where (pos + 1) % ratio == 0,
    else -1 (int64; the c1 / c2 out_loc of the index-K store)."""
    if not isinstance(ratio, int) or ratio < 1:
        raise ValueError(f"dsv4.low_ratio_out_loc: ratio must be a positive int, got {ratio!r}")
    pos, raw = positions.to(torch.int64), raw_out_loc.to(torch.int64)
    return torch.where((pos + 1) % ratio == 0, torch.div(raw, ratio, rounding_mode="floor"),
                       torch.full_like(raw, -1))
