"""Typed wrappers of torch.ops.dsv4.*: one function per operator, same arguments as the
schema in csrc/registration.cpp. The plan classes and compressor functions build on these.

These ops have no autograd (no backward): call them under torch.no_grad() or
torch.inference_mode(); a tensor that requires grad while grad mode is on is an error. In debug
mode (DSV4_OPS_DEBUG=1, dsv4_ops.set_debug(True)) every wrapper here also runs the
data-dependent checks of dsv4_ops.validate (which sync with the device)."""
from typing import Optional, Tuple, Union

import torch

from . import _library  # noqa: F401  (loads the operator library)
from . import _fake  # noqa: F401  (registers the fake implementations)
from . import validate
from .layout import KVLayout

Layout = Union[KVLayout, str]

_ops = torch.ops.dsv4


def plan_decode(req_pool_indices: torch.Tensor, req_to_token: torch.Tensor,
                full_to_state: torch.Tensor, seq_lens: torch.Tensor, compress_ratio: int,
                swa_page_size: int, ring_size: int, use_req_ring: bool = False) -> torch.Tensor:
    """DecodePlan [B, 16] uint8 (docs/contract.md 3.2), SWA-paged or request-ring slots.

    Preconditions (SWA-paged, checked in debug mode): SWA pages are allocated page-aligned,
    full_to_state[req_to_token[rid, pos]] % swa_page_size == pos % swa_page_size, and the
    positions of one swa_page_size block map into one SWA page."""
    plan = _ops.plan_decode(req_pool_indices, req_to_token, full_to_state, seq_lens,
                            compress_ratio, swa_page_size, ring_size, use_req_ring)
    if validate.debug_enabled() and _swa_paged(compress_ratio, use_req_ring):
        validate.validate_swa_tables("plan_decode", req_pool_indices, seq_lens, None, req_to_token,
                                     full_to_state, swa_page_size, _window(compress_ratio))
    return plan


def _swa_paged(compress_ratio: int, use_req_ring: bool) -> bool:
    return compress_ratio == 4 and not use_req_ring


def _window(compress_ratio: int) -> int:
    return 8 if compress_ratio == 4 else 128


def plan_decode_legacy(req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                       compress_ratio: int) -> torch.Tensor:
    """DecodePlan [B, 16] uint8 with legacy slots (one window per request)."""
    return _ops.plan_decode_legacy(req_pool_indices, seq_lens, compress_ratio)


def plan_online_decode(req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                       state_slot_offset: int = 0) -> torch.Tensor:
    """DecodePlan [B, 16] uint8 for the online cr=128 running state (contract 3.5)."""
    return _ops.plan_online_decode(req_pool_indices, seq_lens, state_slot_offset)


def plan_prefill(req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                 extend_lens: torch.Tensor, req_to_token: torch.Tensor,
                 full_to_state: torch.Tensor, compress_ratio: int, swa_page_size: int,
                 ring_size: int, num_q_tokens: int, use_req_ring: bool = False
                 ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(plan_c [num_q_tokens, 16], plan_w [num_q_tokens, 8], counts int32 [2]) (contract 3.3).
    Valid records first, then invalid ones; counts (on seq_lens' device) = valid rows.

    Preconditions: as plan_decode (SWA pages page-aligned, checked in debug mode)."""
    out = _ops.plan_prefill(req_pool_indices, seq_lens, extend_lens, req_to_token,
                            full_to_state, compress_ratio, swa_page_size, ring_size,
                            num_q_tokens, use_req_ring)
    if validate.debug_enabled() and _swa_paged(compress_ratio, use_req_ring):
        validate.validate_swa_tables("plan_prefill", req_pool_indices, seq_lens, extend_lens,
                                     req_to_token, full_to_state, swa_page_size,
                                     _window(compress_ratio))
    return out


def plan_prefill_legacy(req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                        extend_lens: torch.Tensor, compress_ratio: int, num_q_tokens: int
                        ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Legacy prefill planner: outputs as plan_prefill."""
    return _ops.plan_prefill_legacy(req_pool_indices, seq_lens, extend_lens, compress_ratio,
                                    num_q_tokens)


def plan_online_prefill(req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                        extend_lens: torch.Tensor, num_q_tokens: int,
                        state_slot_offset: int = 0
                        ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Online prefill planner (contract 3.5): plan_c and plan_w are both CompressPlan rows."""
    return _ops.plan_online_prefill(req_pool_indices, seq_lens, extend_lens, num_q_tokens,
                                    state_slot_offset)


def compress_forward_op(kv_score_buffer: torch.Tensor, kv_score_input: torch.Tensor,
                        ape: torch.Tensor, plan: torch.Tensor, plan_w: Optional[torch.Tensor],
                        out: torch.Tensor, head_dim: int, compress_ratio: int,
                        is_online: bool = False) -> None:
    """Raw compress_forward: decode when plan_w is None. Writes `out` and the state.

    Preconditions (checked in debug mode): `plan` / `plan_w` were made by the planner of this
    kind (decode / prefill, offline / online) for this compress_ratio, and address rows inside
    kv_score_buffer and kv_score_input. `out` must not share memory with any input."""
    if validate.debug_enabled():
        validate.validate_compress_rows(plan, plan_w, compress_ratio, kv_score_buffer,
                                        kv_score_input, is_online)
    _ops.compress_forward(kv_score_buffer, kv_score_input, ape, plan, plan_w, out, head_dim,
                          compress_ratio, is_online)


def compress_partials_op(kv_score_buffer: torch.Tensor, kv_score_input: torch.Tensor,
                         input_rows: torch.Tensor, ape: torch.Tensor, plan_c: torch.Tensor,
                         plan_w: torch.Tensor, partials: torch.Tensor, persist_rows: torch.Tensor,
                         head_dim: int, compress_ratio: int, read_state: bool) -> None:
    """Raw compress_partials (contract 8): this rank's partials m | s | k (fp32 [3, W, head_dim])
    of the W windows of the batch's plan_c over the rows it holds, and persist_rows: the rows of
    the batch's plan_w it holds (zeros for the others).

    kv_score_input holds this rank's rows; input_rows (int32 [Q], Q the batch's ragged rows) is
    the row of kv_score_input of each ragged row, -1 for a row another rank holds. The state
    rows fold only where read_state (one rank of the group). Preconditions (checked in debug
    mode): the plans were made by plan_prefill / plan_prefill_legacy for this compress_ratio
    and the batch, and every input_rows entry is -1 or a row of kv_score_input; the ranks'
    rows partition the batch's (each ragged row on exactly one rank)."""
    if validate.debug_enabled():
        validate.validate_partials_rows(plan_c, plan_w, compress_ratio, kv_score_buffer,
                                        kv_score_input, input_rows)
    _ops.compress_partials(kv_score_buffer, kv_score_input, input_rows, ape, plan_c, plan_w,
                           partials, persist_rows, head_dim, compress_ratio, read_state)


def merge_partials_op(partials: torch.Tensor, max_m: Optional[torch.Tensor],
                      out: torch.Tensor) -> None:
    """Raw merge_partials (contract 8): merge the partials of R ranks (fp32 [R, 3, W, hd]) and
    an optional bare max (fp32 [W, hd]) into the compressed rows (out fp32 / bf16 [W, hd]) or
    into one partial (out fp32 [3, W, hd])."""
    _ops.merge_partials(partials, max_m, out)


def compress_norm_rope_store_op(kv: torch.Tensor, plan: torch.Tensor, norm_weight: torch.Tensor,
                                freqs: torch.Tensor, out_loc: torch.Tensor,
                                kvcache: torch.Tensor, is_decode: bool, compress_ratio: int,
                                eps: float, page_size: int, store_format: str,
                                layout: Layout = "v4", *, dcp_world_size: int = 1,
                                dcp_rank: int = 0, dcp_interleave: int = 1) -> None:
    """Raw compress_norm_rope_store: freqs is fp32 [max_pos, 64] (cos, sin interleaved).
    A layout other than v4 (the V4.1 cache layouts) needs store_format fp8_ds_mla.

    Preconditions (checked in debug mode): `plan` was made by a planner of the kind `is_decode`
    says for this compress_ratio; every active row's RoPE position seq_len - compress_ratio is
    a row of freqs (rows past the table store nothing) and its destination out_loc is inside
    kvcache (negative: nothing stored). page_size is the cache's: kvcache pages hold at least
    the format's bytes for page_size and fewer than for 2 * page_size (checked always).

    dcp_world_size, dcp_rank, dcp_interleave (contract 9): out_loc names global cache entries;
    this rank stores only those it owns, each at its local slot (dsv4_ops.dcp_local_slot) of
    kvcache, this rank's cache. The defaults are the single-rank store."""
    dcp = (dcp_world_size, dcp_rank, dcp_interleave)
    if validate.debug_enabled():
        validate.validate_store_rows(plan, is_decode, compress_ratio, out_loc, kvcache, page_size,
                                     freqs.shape[0], dcp)
    _ops.compress_norm_rope_store(kv, plan, norm_weight, freqs, out_loc, kvcache, is_decode,
                                  compress_ratio, eps, page_size, store_format,
                                  _layout_name(layout), *dcp)


def compress_and_store_op(kv_score_buffer: torch.Tensor, kv_score_input: torch.Tensor,
                          ape: torch.Tensor, plan: torch.Tensor, plan_w: Optional[torch.Tensor],
                          norm_weight: torch.Tensor, freqs: torch.Tensor, out_loc: torch.Tensor,
                          kvcache: torch.Tensor, out: Optional[torch.Tensor], head_dim: int,
                          compress_ratio: int, is_online: bool, eps: float, page_size: int,
                          store_format: str, layout: Layout = "v4", *, dcp_world_size: int = 1,
                          dcp_rank: int = 0, dcp_interleave: int = 1) -> None:
    """Raw compress_and_store (contract 11): compress_forward_op then
    compress_norm_rope_store_op of the pooled rows (is_decode = plan_w is None), with their
    arguments and bytes. `out` None: the pooled rows are not kept (kv_score_input's dtype
    inside the call); given, it receives them as compress_forward writes them.

    Preconditions (checked in debug mode): those of both ops."""
    dcp = (dcp_world_size, dcp_rank, dcp_interleave)
    if validate.debug_enabled():
        op = "compress_and_store"
        validate.validate_compress_rows(plan, plan_w, compress_ratio, kv_score_buffer,
                                        kv_score_input, is_online, op=op)
        validate.validate_store_rows(plan, plan_w is None, compress_ratio, out_loc, kvcache,
                                     page_size, freqs.shape[0], dcp, op=op)
    _ops.compress_and_store(kv_score_buffer, kv_score_input, ape, plan, plan_w, norm_weight, freqs,
                            out_loc, kvcache, out, head_dim, compress_ratio, is_online, eps,
                            page_size, store_format, _layout_name(layout), *dcp)


# ---- V4.1 ratio-1 / ratio-2 ops (contract V4.1 4.2): plan-free, rows addressed by their own
# positions, request rows and slots. Rows whose ring row, cache page or RoPE position is
# outside its buffer are skipped (errors in debug mode). dcp_world_size, dcp_rank and
# dcp_interleave as for compress_norm_rope_store_op (contract 9): the cache slots are global
# entries, stored only by the rank that owns them; the latents and the pair-state ring are
# written on every rank.

def _layout_name(layout: Layout) -> str:
    return layout.value if isinstance(layout, KVLayout) else layout


def c1_norm_rope_store_op(kv: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                          freqs: torch.Tensor, positions: torch.Tensor, out_loc: torch.Tensor,
                          kvcache: torch.Tensor, page_size: int, layout: Layout,
                          latent: torch.Tensor, *, dcp_world_size: int = 1, dcp_rank: int = 0,
                          dcp_interleave: int = 1) -> None:
    """Ratio 1: every row's latent (bf16 [N, 512], padded rows too); rows with out_loc > 0 are
    rotated at pos and stored at out_loc in `layout`."""
    dcp = (dcp_world_size, dcp_rank, dcp_interleave)
    if validate.debug_enabled():
        validate.validate_c1(positions, out_loc, kvcache, page_size, freqs.shape[0], dcp)
    _ops.c1_norm_rope_store(kv, norm_weight, eps, freqs, positions, out_loc, kvcache, page_size,
                            _layout_name(layout), latent, *dcp)


def c2_norm_rope_store_op(kv_score: torch.Tensor, state: torch.Tensor,
                          norm_weight: torch.Tensor, eps: float, freqs: torch.Tensor,
                          positions: torch.Tensor, req: torch.Tensor, raw_out_loc: torch.Tensor,
                          kvcache: torch.Tensor, page_size: int, ring_size: int, draft_len: int,
                          layout: Layout, latent: torch.Tensor, *, dcp_world_size: int = 1,
                          dcp_rank: int = 0, dcp_interleave: int = 1) -> None:
    """Ratio 2, decode (draft_len 1) or verify (N = B * draft_len rows, blocks of consecutive
    positions): even live rows park in the ring, odd live rows write their latent and store at
    raw_out_loc >> 1; rows with raw_out_loc <= 0 write nothing."""
    dcp = (dcp_world_size, dcp_rank, dcp_interleave)
    if validate.debug_enabled():
        validate.validate_c2(positions, req, raw_out_loc, state, kvcache, page_size, ring_size,
                             freqs.shape[0], dcp)
    _ops.c2_norm_rope_store(kv_score, state, norm_weight, eps, freqs, positions, req,
                            raw_out_loc, kvcache, page_size, ring_size, draft_len,
                            _layout_name(layout), latent, *dcp)


def c2_prefill_norm_rope_store_op(kv_score: torch.Tensor, state: torch.Tensor,
                                  norm_weight: torch.Tensor, eps: float, freqs: torch.Tensor,
                                  positions: torch.Tensor, req: torch.Tensor,
                                  raw_out_loc: torch.Tensor, extend_start_loc: torch.Tensor,
                                  extend_seq_lens: torch.Tensor, kvcache: torch.Tensor,
                                  page_size: int, ring_size: int, layout: Layout,
                                  latent: torch.Tensor, *, dcp_world_size: int = 1,
                                  dcp_rank: int = 0, dcp_interleave: int = 1) -> None:
    """Ratio 2, extend: request i owns rows [extend_start_loc[i], + extend_seq_lens[i]); odd
    live rows pair in the batch or with the ring, then each request parks its last
    min(len, ring_size) live rows."""
    dcp = (dcp_world_size, dcp_rank, dcp_interleave)
    if validate.debug_enabled():
        validate.validate_c2_prefill(positions, req, raw_out_loc, extend_start_loc,
                                     extend_seq_lens, state, kvcache, page_size, ring_size,
                                     freqs.shape[0], dcp)
    _ops.c2_prefill_norm_rope_store(kv_score, state, norm_weight, eps, freqs, positions, req,
                                    raw_out_loc, extend_start_loc, extend_seq_lens, kvcache,
                                    page_size, ring_size, _layout_name(layout), latent, *dcp)


def low_ratio_index_k_store_op(k: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                               freqs: torch.Tensor, positions: torch.Tensor, loc: torch.Tensor,
                               cache: torch.Tensor, page_size: int, ratio: int, *,
                               dcp_world_size: int = 1, dcp_rank: int = 0,
                               dcp_interleave: int = 1) -> None:
    """Low-ratio index keys k (bf16 [N, 128]) into the 68-byte-slot index-K cache at loc
    (rows with loc <= 0 write nothing), RoPE at pos & ~(ratio - 1)."""
    dcp = (dcp_world_size, dcp_rank, dcp_interleave)
    if validate.debug_enabled():
        validate.validate_index_k(positions, loc, cache, page_size, ratio, freqs.shape[0], dcp)
    _ops.low_ratio_index_k_store(k, norm_weight, eps, freqs, positions, loc, cache, page_size,
                                 ratio, *dcp)


def kv_store_op(x: torch.Tensor, loc: torch.Tensor, freqs_rows: Optional[torch.Tensor],
                kvcache: torch.Tensor, page_size: int, layout: Layout, *,
                dcp_world_size: int = 1, dcp_rank: int = 0, dcp_interleave: int = 1) -> None:
    """Rows x (bf16 / fp32 [N, 512]) encoded in `layout` at loc (rows with loc < 0 write
    nothing); freqs_rows (fp32 [N, 64], V41 layouts only) rotates dims 448..511 first."""
    dcp = (dcp_world_size, dcp_rank, dcp_interleave)
    if validate.debug_enabled():
        validate.validate_kv_store(loc, kvcache, page_size, dcp)
    _ops.kv_store(x, loc, freqs_rows, kvcache, page_size, _layout_name(layout), *dcp)


def online_c128_mtp_write_prefix_states_op(kv_score_input: torch.Tensor, seq_lens: torch.Tensor,
                                           req_pool_indices: torch.Tensor,
                                           req_to_token: torch.Tensor, ape: torch.Tensor,
                                           state: torch.Tensor, batch_size: int,
                                           num_verify_tokens: int, state_slot_stride: int,
                                           head_dim: int) -> None:
    """Stage the online cr=128 state after each verify token (contract 10.2); writes `state`."""
    _ops.online_c128_mtp_write_prefix_states(kv_score_input, seq_lens, req_pool_indices,
                                             req_to_token, ape, state, batch_size,
                                             num_verify_tokens, state_slot_stride, head_dim)


def online_c128_mtp_mark_pending_op(seq_lens: torch.Tensor, req_pool_indices: torch.Tensor,
                                    pending_seq_lens: torch.Tensor, batch_size: int,
                                    num_req_slots: int) -> None:
    """Record the verify batch's committed lengths (contract 10.3); writes `pending_seq_lens`."""
    _ops.online_c128_mtp_mark_pending(seq_lens, req_pool_indices, pending_seq_lens, batch_size,
                                      num_req_slots)


def online_c128_mtp_commit_pending_op(seq_lens: torch.Tensor, req_pool_indices: torch.Tensor,
                                      req_to_token: torch.Tensor, pending_seq_lens: torch.Tensor,
                                      state: torch.Tensor, batch_size: int,
                                      num_verify_tokens: int, state_slot_stride: int,
                                      num_req_slots: int, head_dim: int) -> None:
    """Commit each request's accepted prefix into its main slot (contract 10.4); writes `state`."""
    _ops.online_c128_mtp_commit_pending(seq_lens, req_pool_indices, req_to_token,
                                        pending_seq_lens, state, batch_size, num_verify_tokens,
                                        state_slot_stride, num_req_slots, head_dim)
