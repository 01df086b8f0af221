"""Plan validation: catches plan records that point outside the buffers they are used with.

The kernels themselves never read or write out of bounds (they skip such records); this
helper turns those silent skips into errors that name the record, for debugging an engine's
metadata. It syncs with the device, so it is off by default: call it directly, or set
DSV4_OPS_DEBUG=1 (or dsv4_ops.set_debug(True)) to run it before every compressor op.
"""
import os

import torch

_debug = os.environ.get("DSV4_OPS_DEBUG", "0") == "1"


def set_debug(enabled: bool) -> None:
    global _debug
    _debug = bool(enabled)


def debug_enabled() -> bool:
    return _debug and not torch.compiler.is_compiling()


def _words(plan: torch.Tensor, n: int) -> torch.Tensor:
    return plan.contiguous().view(torch.int32).view(-1, n).to(torch.int64).cpu()


def _fail(op: str, what: str, bad: torch.Tensor, rows: torch.Tensor) -> None:
    idx = int(bad.nonzero()[0, 0])
    raise ValueError(f"dsv4.{op}: plan record {idx} {what} (record words: {rows[idx].tolist()})")


def _check_range(op, name, values, lo, hi, rows, active):
    bad = active & ((values < lo) | (values >= hi))
    if bool(bad.any()):
        _fail(op, f"has {name} outside [{lo}, {hi})", bad, rows)


def validate_compress(plan, kv_score_buffer: torch.Tensor, kv_score_input: torch.Tensor,
                      is_online: bool = False) -> None:
    """Every record of `plan` addresses rows inside kv_score_buffer / kv_score_input."""
    op = "compress_forward"
    cr = plan.compress_ratio
    row = kv_score_buffer.shape[-1]
    slots = kv_score_buffer.numel() // row
    pages = slots if is_online else slots // cr
    tokens = kv_score_input.shape[0]
    if plan.is_decode:
        d = _words(plan[1], 4)
        _check_range(op, "write_loc", d[:, 1], -1, slots, d, torch.ones_like(d[:, 0], dtype=torch.bool))
        for col, name in ((2, "read_page_0"), (3, "read_page_1")):
            _check_range(op, name, d[:, col], -1, pages, d, d[:, 0] % cr == 0)
        return
    c = _words(plan[1], 4)
    valid = c[:, 0] != -1
    ragged, buffer_len = c[:, 1] & 0xFFFF, (c[:, 1] >> 16) & 0xFFFF
    _check_range(op, "ragged_id", ragged, 0, tokens, c, valid)
    uses_state = valid & (buffer_len > 0)
    for col, name in ((2, "read_page_0"), (3, "read_page_1")):
        _check_range(op, name, c[:, col], -1, pages, c, uses_state)
    if is_online:
        w = _words(plan[2], 4)
        wvalid = w[:, 0] != -1
        _check_range(op, "plan_w ragged_id", w[:, 1] & 0xFFFF, 0, tokens, w, wvalid)
        _check_range(op, "plan_w read_page_0", w[:, 2], -1, slots, w, wvalid)
    else:
        w = _words(plan[2], 2)
        wvalid = w[:, 0] != -1
        _check_range(op, "plan_w ragged_id", w[:, 0], 0, tokens, w, wvalid)
        _check_range(op, "plan_w write_loc", w[:, 1], -1, slots, w, wvalid)


def validate_store(plan, out_loc: torch.Tensor, kvcache: torch.Tensor, page_size: int,
                   max_pos: int) -> None:
    """Every active record has a destination inside the cache and a RoPE position < max_pos."""
    op = "compress_norm_rope_store"
    cr = plan.compress_ratio
    capacity = kvcache.shape[0] * page_size
    loc = out_loc.to(torch.int64).cpu()
    d = _words(plan[1], 4)
    if plan.is_decode:
        active = (d[:, 0] % cr == 0) & (d[:, 1] >= 0)
        if d.shape[0] != loc.shape[0]:
            raise ValueError(f"dsv4.{op}: out_loc has {loc.shape[0]} rows, the plan {d.shape[0]}")
        dest = loc
    else:
        active = d[:, 0] != -1
        ragged = d[:, 1] & 0xFFFF
        _check_range(op, "ragged_id (row of out_loc)", ragged, 0, loc.shape[0], d, active)
        dest = loc[ragged.clamp(max=max(loc.shape[0] - 1, 0))] if loc.numel() else ragged
    _check_range(op, "destination out_loc", dest, 0, capacity, d, active)
    _check_range(op, "rope position seq_len - compress_ratio", (d[:, 0] & 0xFFFFFFFF) - cr,
                 0, max_pos, d, active)
