"""The reference engine's compressor API (docs/contract.md 5), so that engine code runs on dsv4_ops by
changing one import: compress_forward and compress_norm_rope_store taking plan objects."""
import math
from typing import Optional, Union

import torch

from . import ops
from .layout import STORE_FORMATS, KVLayout
from .plans import CompressorDecodePlan, CompressorPrefillPlan

Plan = Union[CompressorDecodePlan, CompressorPrefillPlan]


def compress_forward(kv_score_buffer: torch.Tensor, kv_score_input: torch.Tensor,
                     ape: torch.Tensor, plan: Plan, *, head_dim: int, compress_ratio: int,
                     out: Optional[torch.Tensor] = None, is_online: bool = False) -> torch.Tensor:
    """Pool every window the plan closes into `out` [N, head_dim] and persist the raw rows
    (or the online running state) the plan asks for into `kv_score_buffer`.

    N is the number of plan rows (decode: batch size, rows that close no window are zeros;
    prefill: plan_c rows, invalid rows are zeros). `out` defaults to kv_score_input's dtype and
    must not share memory with the other arguments. No autograd: run under torch.no_grad() or
    torch.inference_mode(). Precondition (checked in debug mode): the plan was made for this
    call (online planners for is_online) and addresses rows inside the buffers.
    """
    try:
        plan_ratio, decode = plan.compress_ratio, plan.is_decode
    except AttributeError as err:
        _check_plan("compress_forward", plan, err)
        raise
    if plan_ratio != compress_ratio:
        raise ValueError(f"dsv4.compress_forward: compress_ratio={compress_ratio} but the plan "
                         f"was built for {plan_ratio}")
    rows, plan_w = plan[1], (None if decode else plan[2])
    if out is None:
        out = kv_score_input.new_empty((rows.shape[0], head_dim))
    ops.compress_forward_op(kv_score_buffer, kv_score_input, ape, rows, plan_w, out, head_dim,
                            compress_ratio, is_online)
    return out


def _format_table():
    """(head_dim, use_fp4, bf16_store) -> store format, from STORE_FORMATS (one dict lookup per
    store call)."""
    main = STORE_FORMATS["fp8_ds_mla"].head_dim
    indexer = STORE_FORMATS["fp8_indexer"].head_dim
    return {(main, False, False): "fp8_ds_mla", (main, False, True): "bf16",
            (indexer, False, False): "fp8_indexer", (indexer, True, False): "fp4_indexer"}


_FORMAT_OF = _format_table()


def store_format_of(head_dim: int, use_fp4: bool = False, bf16_store: bool = False,
                    fn: str = "compress_norm_rope_store") -> str:
    """The cache format compress_norm_rope_store writes for this head_dim and flags (a key of
    dsv4_ops.STORE_FORMATS); errors name the function `fn`."""
    fmt = _FORMAT_OF.get((head_dim, bool(use_fp4), bool(bf16_store)))
    if fmt is not None:
        return fmt
    if head_dim not in {f.head_dim for f in STORE_FORMATS.values()}:
        what = "head_dim" if fn == "compress_and_store" else "kv.shape[1] (head_dim)"
        raise ValueError(f"dsv4.{fn}: {what} must be 128 or 512, got {head_dim}")
    if use_fp4 and head_dim != STORE_FORMATS["fp4_indexer"].head_dim:
        raise ValueError(f"dsv4.{fn}: use_fp4 needs head_dim 128 (indexer)")
    raise ValueError(f"dsv4.{fn}: bf16_store needs head_dim 512")


# The Python layer's own checks run only once a call has failed (no host time on the hot
# path): they name the argument as this API spells it, or let the op's error through.

def _check_plan(fn: str, plan, err: Exception) -> None:
    if not isinstance(plan, (CompressorDecodePlan, CompressorPrefillPlan)):
        raise TypeError(f"dsv4.{fn}: plan must be a CompressorDecodePlan or CompressorPrefillPlan "
                        f"(from their generate* methods), got {type(plan).__name__}; the raw "
                        f"plan tensors go to dsv4_ops.ops.{fn}_op") from err


def _check_store_args(plan, norm_eps, freq_cis, err: Exception,
                      fn: str = "compress_norm_rope_store") -> None:
    _check_plan(fn, plan, err)
    eps = float(norm_eps)
    if not 0.0 <= eps < math.inf:
        raise ValueError(f"dsv4.{fn}: norm_eps must be finite and >= 0, got {norm_eps}") from err
    want = 32 if freq_cis.is_complex() else 64
    if freq_cis.dim() != 2 or freq_cis.shape[1] != want \
            or freq_cis.dtype not in (torch.complex64, torch.float32) \
            or not freqs_as_real(freq_cis).is_contiguous():
        raise ValueError(f"dsv4.{fn}: freq_cis must be complex64 "
                         f"[max_pos, 32] (or its real view, float32 [max_pos, 64]), contiguous, "
                         f"got {freq_cis.dtype} {list(freq_cis.shape)} with strides "
                         f"{freq_cis.stride()}") from err


def _store_layout(layout, fmt: str, fn: str = "compress_norm_rope_store") -> str:
    """The layout's name; a V4.1 layout needs the fp8_ds_mla format (head_dim 512, neither
    use_fp4 nor bf16_store)."""
    try:
        kv_layout = KVLayout.parse(layout)
    except ValueError as err:
        raise ValueError(f"dsv4.{fn}: layout must be one of "
                         f"{', '.join(m.value for m in KVLayout)}, got {layout!r}") from err
    if kv_layout is not KVLayout.V4 and fmt != "fp8_ds_mla":
        raise ValueError(f"dsv4.{fn}: layout {kv_layout.value} needs "
                         f"head_dim 512 without use_fp4 or bf16_store (store format "
                         f"fp8_ds_mla), got store format {fmt}")
    return kv_layout.value


def freqs_as_real(freq_cis: torch.Tensor) -> torch.Tensor:
    """complex [max_pos, 32] -> fp32 [max_pos, 64] = (cos0, sin0, cos1, sin1, ...), a view."""
    if not freq_cis.is_complex():
        return freq_cis
    if freq_cis.dtype == torch.complex64 and freq_cis.stride(-1) == 1:
        # One view op, on every store call of a complex table: view_as_real + flatten are two.
        return freq_cis.view(torch.float32)
    return torch.view_as_real(freq_cis).flatten(-2)


def compress_norm_rope_store(kv: torch.Tensor, plan: Plan, *, norm_weight: torch.Tensor,
                             norm_eps: float, freq_cis: torch.Tensor, out_loc: torch.Tensor,
                             kvcache: torch.Tensor, page_size: int, use_fp4: bool = False,
                             bf16_store: bool = False,
                             layout: Union[KVLayout, str] = KVLayout.V4, dcp_world_size: int = 1,
                             dcp_rank: int = 0, dcp_interleave: int = 1) -> None:
    """RMSNorm + RoPE (+ Hadamard for head_dim 128) of every compressed token the plan makes,
    quantised into the paged cache at out_loc. Rows that close no window write nothing.

    page_size is the cache's (kvcache pages hold the format's bytes for page_size, padded by
    less than a doubling); norm_eps is finite and >= 0. No autograd. Preconditions (checked in
    debug mode): each active row's RoPE position seq_len - compress_ratio is a row of freq_cis
    (rows past the table store nothing) and its out_loc is inside the cache (negative: nothing
    stored).

    layout: the cache's KVLayout. Other than V4 (the V4.1 layouts, contract V4.1 4.2) only for
    head_dim 512 without use_fp4 / bf16_store: the normed and rotated values are rounded to
    kv's dtype and all 512 dims encoded in the layout.

    dcp_world_size, dcp_rank, dcp_interleave (contract 9): decode context parallelism. out_loc
    names global cache entries; this rank stores only those it owns
    (`dsv4_ops.dcp_local_slot(g, ...) >= 0`), each at its local slot of kvcache (this rank's
    cache, `dsv4_ops.dcp_local_pages` pages). The defaults are the single-rank store."""
    if kv.dim() != 2:
        raise ValueError(f"dsv4.compress_norm_rope_store: kv must be 2-D [N, head_dim], got {tuple(kv.shape)}")
    fmt = store_format_of(kv.shape[1], use_fp4, bf16_store)
    kv_layout = _store_layout(layout, fmt)
    try:
        ops.compress_norm_rope_store_op(kv, plan[1], norm_weight, freqs_as_real(freq_cis),
                                        out_loc, kvcache, plan.is_decode, plan.compress_ratio,
                                        float(norm_eps), int(page_size), fmt, kv_layout,
                                        dcp_world_size=int(dcp_world_size),
                                        dcp_rank=int(dcp_rank),
                                        dcp_interleave=int(dcp_interleave))
    except (AttributeError, IndexError, RuntimeError, TypeError, ValueError) as err:
        _check_store_args(plan, norm_eps, freq_cis, err)
        raise


def compress_and_store(kv_score_buffer: torch.Tensor, kv_score_input: torch.Tensor,
                       ape: torch.Tensor, plan: Plan, *, head_dim: int, compress_ratio: int,
                       norm_weight: torch.Tensor, norm_eps: float, freq_cis: torch.Tensor,
                       out_loc: torch.Tensor, kvcache: torch.Tensor, page_size: int,
                       use_fp4: bool = False, bf16_store: bool = False, is_online: bool = False,
                       out: Optional[torch.Tensor] = None,
                       layout: Union[KVLayout, str] = KVLayout.V4, dcp_world_size: int = 1,
                       dcp_rank: int = 0, dcp_interleave: int = 1) -> Optional[torch.Tensor]:
    """compress_forward followed by compress_norm_rope_store of its rows, in one op (contract
    11): the same state rows, cache bytes and (when given) `out` as the two calls with these
    arguments. Returns `out`: None unless the caller passes the tensor for the pooled rows
    ([N, head_dim] fp32 / bf16), which are otherwise not kept (they are kv_score_input's dtype
    inside the call, as compress_forward's default `out`).

    The store format comes from head_dim and the flags as in compress_norm_rope_store; the
    arguments, preconditions and errors are the two functions', named compress_and_store."""
    fn = "compress_and_store"
    try:
        plan_ratio, decode = plan.compress_ratio, plan.is_decode
    except AttributeError as err:
        _check_plan(fn, plan, err)
        raise
    if plan_ratio != compress_ratio:
        raise ValueError(f"dsv4.{fn}: compress_ratio={compress_ratio} but the plan was built for "
                         f"{plan_ratio}")
    fmt = store_format_of(head_dim, use_fp4, bf16_store, fn)
    kv_layout = _store_layout(layout, fmt, fn)
    try:
        ops.compress_and_store_op(kv_score_buffer, kv_score_input, ape, plan[1],
                                  None if decode else plan[2], norm_weight,
                                  freqs_as_real(freq_cis), out_loc, kvcache, out, head_dim,
                                  compress_ratio, is_online, float(norm_eps), int(page_size), fmt,
                                  kv_layout, dcp_world_size=int(dcp_world_size),
                                  dcp_rank=int(dcp_rank), dcp_interleave=int(dcp_interleave))
    except (IndexError, RuntimeError, TypeError, ValueError) as err:
        _check_store_args(plan, norm_eps, freq_cis, err, fn)
        raise
    return out
