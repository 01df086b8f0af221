"""Plan validation: catches plan records that point outside the buffers they are used with,
records of another kind or compress ratio than the call says, and page tables that break the
SWA-paged addressing (docs/contract.md 2.1).

The kernels themselves never read or write out of bounds (they skip such records); this
helper turns those silent skips into errors that name the record, for debugging an engine's
metadata. It syncs with the device, so it is off by default: call it directly, or set
DSV4_OPS_DEBUG=1 (or dsv4_ops.set_debug(True)) to run it inside every dsv4_ops op call
(the planners, compress_forward and compress_norm_rope_store, raw wrappers in dsv4_ops.ops
included). The V4.1 ops (plan-free) get the same for their rows: ring rows, cache pages and
RoPE positions outside their buffers (contract V4.1 4.4).
"""
import os
from typing import Optional, Tuple

import torch

from .layout import dcp_local_slot

_debug = os.environ.get("DSV4_OPS_DEBUG", "0") == "1"

_INVALID_SEQ_LEN = 0xFFFFFFFF


def set_debug(enabled: bool) -> None:
    global _debug
    _debug = bool(enabled)


def debug_enabled() -> bool:
    return _debug and not torch.compiler.is_compiling()


def _words(plan: torch.Tensor, n: int) -> torch.Tensor:
    p = plan.contiguous()
    if p.storage_offset() % 4 != 0:  # a view at an odd byte offset cannot be read as int32
        p = p.clone()
    return p.view(torch.int32).view(-1, n).to(torch.int64).cpu()


def _fail(op: str, what: str, bad: torch.Tensor, rows: torch.Tensor) -> None:
    idx = int(bad.nonzero()[0, 0])
    raise ValueError(f"dsv4.{op}: plan record {idx} {what} (record words: {rows[idx].tolist()})")


def _check_range(op, name, values, lo, hi, rows, active):
    bad = active & ((values < lo) | (values >= hi))
    if bool(bad.any()):
        _fail(op, f"has {name} outside [{lo}, {hi})", bad, rows)


def _check_decode_form(op: str, d: torch.Tensor, cr: int, online: Optional[bool]) -> None:
    """DecodePlan records as the planners write them (contract 3.2, 3.5): {0, -1, -1, -1} for an
    entry without a token; offline read_page_1 = write_loc / compress_ratio; online
    read_page_0 = write_loc and read_page_1 = -1 (online None: either form). A record of a
    prefill plan, or of a plan for another compress ratio, fails this."""
    seq_len, wl, rp0, rp1 = (d[:, 0] & 0xFFFFFFFF), d[:, 1], d[:, 2], d[:, 3]
    empty = (seq_len == 0) & (wl == -1) & (rp0 == -1) & (rp1 == -1)
    offline = torch.where(wl >= 0, rp1 == torch.div(wl, cr, rounding_mode="floor"), rp1 == -1)
    on = (rp0 == wl) & (rp1 == -1)
    ok = offline if online is False else (on if online else offline | on)
    bad = (seq_len != 0) & ~ok | (seq_len == 0) & ~empty
    if bool(bad.any()):
        form = "online " if online else ""
        _fail(op, f"is not a {form}decode record for compress_ratio {cr} (a prefill plan passed "
              f"as decode, or a plan made for another compress ratio?)", bad, d)


def _check_prefill_form(op: str, c: torch.Tensor, cr: int, online: Optional[bool],
                        closing: bool = True) -> None:
    """Valid CompressPlan records (contract 3.1, 3.3, 3.5): seq_len a positive multiple of
    compress_ratio (an online plan_w segment, closing=False: not a multiple of 128),
    buffer_len < the window (offline) or in [1, 128] (online segments). A record of a decode
    plan, or of a plan for another compress ratio, fails this."""
    seq_len = c[:, 0] & 0xFFFFFFFF
    valid = seq_len != _INVALID_SEQ_LEN
    buffer_len = (c[:, 1] >> 16) & 0xFFFF
    win = 8 if cr == 4 else 128
    if online is None:
        bl_ok = buffer_len < win if cr == 4 else buffer_len <= 128
    else:
        bl_ok = (buffer_len >= 1) & (buffer_len <= 128) if online else buffer_len < win
    closes = (seq_len % cr == 0) & (seq_len >= cr)
    form_ok = (closes if closing else seq_len % cr != 0) & bl_ok
    bad = valid & ~form_ok
    if bool(bad.any()):
        _fail(op, f"is not a prefill compress record for compress_ratio {cr} (a decode plan "
              f"passed as prefill, or a plan made for another compress ratio?)", bad, c)


def validate_compress_rows(plan: torch.Tensor, plan_w: Optional[torch.Tensor], compress_ratio: int,
                           kv_score_buffer: torch.Tensor, kv_score_input: torch.Tensor,
                           is_online: bool = False, op: str = "compress_forward",
                           num_in_rows: Optional[int] = None) -> None:
    """validate_compress on the raw plan tensors (plan_w None: decode); ragged ids index
    num_in_rows rows (default: kv_score_input's)."""
    cr = compress_ratio
    row = kv_score_buffer.shape[-1]
    slots = kv_score_buffer.numel() // row
    pages = slots if is_online else slots // cr
    tokens = kv_score_input.shape[0] if num_in_rows is None else num_in_rows
    if plan_w is None:
        d = _words(plan, 4)
        _check_range(op, "write_loc", d[:, 1], -1, slots, d, torch.ones_like(d[:, 0], dtype=torch.bool))
        for col, name in ((2, "read_page_0"), (3, "read_page_1")):
            _check_range(op, name, d[:, col], -1, pages, d, d[:, 0] % cr == 0)
        _check_decode_form(op, d, cr, is_online)
        return
    c = _words(plan, 4)
    valid = c[:, 0] != -1
    ragged, buffer_len = c[:, 1] & 0xFFFF, (c[:, 1] >> 16) & 0xFFFF
    _check_range(op, "ragged_id", ragged, 0, tokens, c, valid)
    uses_state = valid & (buffer_len > 0)
    for col, name in ((2, "read_page_0"), (3, "read_page_1")):
        _check_range(op, name, c[:, col], -1, pages, c, uses_state)
    _check_prefill_form(op, c, cr, is_online)
    if is_online:
        w = _words(plan_w, 4)
        _check_prefill_form(f"{op} (plan_w)", w, cr, True, closing=False)
        wvalid = w[:, 0] != -1
        _check_range(op, "plan_w ragged_id", w[:, 1] & 0xFFFF, 0, tokens, w, wvalid)
        _check_range(op, "plan_w read_page_0", w[:, 2], -1, slots, w, wvalid)
    else:
        w = _words(plan_w, 2)
        wvalid = w[:, 0] != -1
        _check_range(op, "plan_w ragged_id", w[:, 0], 0, tokens, w, wvalid)
        _check_range(op, "plan_w write_loc", w[:, 1], -1, slots, w, wvalid)


def validate_partials_rows(plan_c: torch.Tensor, plan_w: torch.Tensor, compress_ratio: int,
                           kv_score_buffer: torch.Tensor, kv_score_input: torch.Tensor,
                           input_rows: torch.Tensor) -> None:
    """compress_partials (contract 8): the batch's plan records address the state and the
    batch's ragged rows (input_rows' length), and every input_rows entry is -1 or a row of
    kv_score_input."""
    op = "compress_partials"
    validate_compress_rows(plan_c, plan_w, compress_ratio, kv_score_buffer, kv_score_input,
                           op=op, num_in_rows=input_rows.shape[0])
    local = input_rows.to(torch.int64).cpu()
    bad = (local < -1) | (local >= kv_score_input.shape[0])
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"dsv4.{op}: input_rows[{i}] = {int(local[i])} is neither -1 (a row "
                         f"another rank holds) nor a row of kv_score_input "
                         f"({kv_score_input.shape[0]} rows)")


def validate_compress(plan, kv_score_buffer: torch.Tensor, kv_score_input: torch.Tensor,
                      is_online: bool = False) -> None:
    """Every record of `plan` (a CompressorDecodePlan / CompressorPrefillPlan) is a record of
    its kind and ratio and addresses rows inside kv_score_buffer / kv_score_input."""
    validate_compress_rows(plan[1], None if plan.is_decode else plan[2], plan.compress_ratio,
                           kv_score_buffer, kv_score_input, is_online)


def _owned(loc: torch.Tensor, live: torch.Tensor, dcp) -> Tuple[torch.Tensor, torch.Tensor]:
    """(slot in this rank's cache, rows that store here) of the global entries loc of the live
    rows under DCP (world_size, rank, interleave) (contract 9): another rank's entries drop out,
    negative ones stay as they are."""
    w, rank, interleave = dcp if dcp is not None else (1, 0, 1)
    if w == 1 or not (w >= 1 and 0 <= rank < w and interleave >= 1):
        return loc, live  # one rank, or arguments the op itself refuses
    local = torch.where(loc >= 0, dcp_local_slot(loc.clamp(min=0), *dcp), loc)
    return local, live & ~((loc >= 0) & (local < 0))


def validate_store_rows(plan: torch.Tensor, is_decode: bool, compress_ratio: int,
                        out_loc: torch.Tensor, kvcache: torch.Tensor, page_size: int,
                        max_pos: int, dcp=None, op: str = "compress_norm_rope_store") -> None:
    """validate_store on the raw plan tensor; dcp: (world_size, rank, interleave) of a DCP
    store (contract 9); errors name `op`."""
    cr = compress_ratio
    capacity = kvcache.shape[0] * page_size
    loc = out_loc.to(torch.int64).cpu()
    d = _words(plan, 4)
    if is_decode:
        _check_decode_form(op, d, cr, None)
    else:
        _check_prefill_form(op, d, cr, None)
    if is_decode:
        active = (d[:, 0] % cr == 0) & (d[:, 1] >= 0)
        if d.shape[0] != loc.shape[0]:
            raise ValueError(f"dsv4.{op}: out_loc has {loc.shape[0]} rows, the plan {d.shape[0]}")
        dest = loc
    else:
        active = d[:, 0] != -1
        ragged = d[:, 1] & 0xFFFF
        _check_range(op, "ragged_id (row of out_loc)", ragged, 0, loc.shape[0], d, active)
        dest = loc[ragged.clamp(max=max(loc.shape[0] - 1, 0))] if loc.numel() else ragged
    dest, stores = _owned(dest, active, dcp)
    _check_range(op, "destination out_loc", dest, 0, capacity, d, stores)
    _check_range(op, "rope position seq_len - compress_ratio (row of freq_cis)",
                 (d[:, 0] & 0xFFFFFFFF) - cr, 0, max_pos, d, active)


def validate_store(plan, out_loc: torch.Tensor, kvcache: torch.Tensor, page_size: int,
                   max_pos: int, dcp=None) -> None:
    """Every active record is a record of the plan's kind and ratio, with a destination inside
    the cache and a RoPE position seq_len - compress_ratio < max_pos (rows of freq_cis)."""
    validate_store_rows(plan[1], plan.is_decode, plan.compress_ratio, out_loc, kvcache,
                        page_size, max_pos, dcp)


def validate_swa_tables(op: str, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor,
                        extend_lens: Optional[torch.Tensor], req_to_token: torch.Tensor,
                        full_to_state: torch.Tensor, swa_page_size: int, window: int) -> None:
    """The SWA-paged slot formula (contract 2.1), slot = (swa // sps) * ring + swa % ring, keeps a
    window's rows only if SWA pages are allocated page-aligned: for every live position pos of
    request row rid, swa = full_to_state[req_to_token[rid, pos]] has swa % sps == pos % sps,
    and the positions of one sps-aligned block map into one SWA page. Checked over the
    positions a plan reads or writes: [max(prefix - window, 0), seq_len) (decode: prefix =
    seq_len - 1); evicted entries (< 0) and lookups outside the tables are skipped."""
    sps = int(swa_page_size)
    rids = req_pool_indices.to(torch.int64).cpu().tolist()
    sls = seq_lens.to(torch.int64).cpu().tolist()
    els = [1] * len(sls) if extend_lens is None else extend_lens.to(torch.int64).cpu().tolist()
    rows, ctx, n_full = req_to_token.shape[0], req_to_token.shape[1], full_to_state.shape[0]
    for b, (rid, sl, el) in enumerate(zip(rids, sls, els)):
        lo, hi = max(sl - max(el, 0) - window, 0), min(sl, ctx)
        if rid < 0 or rid >= rows or hi <= lo or n_full == 0:
            continue
        # gathered where the tables live: only the positions checked travel to the host
        full_d = req_to_token[rid, lo:hi].to(torch.int64)
        live_d = (full_d >= 0) & (full_d < n_full)
        swa_d = torch.where(live_d, full_to_state[full_d.clamp(0, n_full - 1)], -1)
        pos = torch.arange(lo, hi, dtype=torch.int64)
        full, swa = full_d.cpu(), swa_d.cpu()
        live = swa >= 0
        pos, swa, full = pos[live], swa[live], full[live]
        shift = swa - pos
        bad = shift % sps != 0
        block = torch.div(pos, sps, rounding_mode="floor")
        split = torch.zeros_like(bad)
        split[1:] = (block[1:] == block[:-1]) & (shift[1:] != shift[:-1])
        bad |= split
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            p, f, s = int(pos[i]), int(full[i]), int(swa[i])
            raise ValueError(
                f"dsv4.{op}: full_to_state is not page-aligned for SWA-paged addressing: batch "
                f"entry {b} (request row {rid}) position {p} -> req_to_token {f} -> full_to_state "
                f"{s}; needs full_to_state[req_to_token[rid, pos]] % swa_page_size == "
                f"pos % swa_page_size ({s % sps} vs {p % sps}, swa_page_size {sps}), with the "
                f"positions of one swa_page_size block in one SWA page")


# ---- V4.1 ratio-1 / ratio-2 ops (contract V4.1 4.4, "In debug mode") -------------------------
# The kernels skip a row whose ring row, cache page or RoPE position is outside its buffer;
# these checks make such a row an error that names it.

def _host(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.int64).cpu()


def _fail_row(op: str, what: str, bad: torch.Tensor, **columns) -> None:
    if bool(bad.any()):
        idx = int(bad.nonzero()[0, 0])
        vals = ", ".join(f"{k} {int(v[idx])}" for k, v in columns.items())
        raise ValueError(f"dsv4.{op}: row {idx} {what} ({vals})")


def _check_cache_rows(op: str, arg: str, loc: torch.Tensor, live: torch.Tensor, num_pages: int,
                      page_size: int) -> None:
    page = torch.div(loc, page_size, rounding_mode="floor")
    _fail_row(op, f"has a {arg} page outside {arg} ({num_pages} pages of {page_size} slots)",
              live & (page >= num_pages), loc=loc)


def _check_rope_rows(op: str, rope_pos: torch.Tensor, live: torch.Tensor, max_pos: int,
                     pos: torch.Tensor) -> None:
    _fail_row(op, f"has a RoPE position outside freqs [0, {max_pos})",
              live & ((rope_pos < 0) | (rope_pos >= max_pos)), position=pos, rope_position=rope_pos)


def _check_ring_rows(op: str, rid: torch.Tensor, live: torch.Tensor, ring_size: int,
                     state_rows: int) -> None:
    """Every live row's request owns a whole ring inside state: rows rid*ring .. rid*ring+ring-1."""
    bad = live & ((rid < 0) | (rid * ring_size + ring_size > state_rows))
    _fail_row(op, f"has a pair-state ring outside state ({state_rows} rows, ring_size "
                  f"{ring_size})", bad, req=rid)


def validate_c1(positions: torch.Tensor, out_loc: torch.Tensor, kvcache: torch.Tensor,
                page_size: int, max_pos: int, dcp=None) -> None:
    """Every row that stores (out_loc > 0) has a cache page inside kvcache and a RoPE position
    pos inside freqs."""
    op = "c1_norm_rope_store"
    pos, loc = _host(positions), _host(out_loc)
    live = loc > 0
    _check_cache_rows(op, "kvcache", *_owned(loc, live, dcp), kvcache.shape[0], page_size)
    _check_rope_rows(op, pos, live, max_pos, pos)


def _validate_c2_rows(op: str, live: torch.Tensor, pos: torch.Tensor, rid: torch.Tensor,
                      raw: torch.Tensor, kvcache: torch.Tensor, state_rows: int, page_size: int,
                      ring_size: int, max_pos: int, dcp) -> None:
    _fail_row(op, "has a negative position", live & (pos < 0), position=pos)
    _check_ring_rows(op, rid, live, ring_size, state_rows)
    odd = live & (pos % 2 == 1)
    loc = raw >> 1
    stores = odd & (loc > 0)
    _check_cache_rows(op, "kvcache", *_owned(loc, stores, dcp), kvcache.shape[0], page_size)
    _check_rope_rows(op, pos - 1, stores, max_pos, pos)


def validate_c2(positions: torch.Tensor, req: torch.Tensor, raw_out_loc: torch.Tensor,
                state: torch.Tensor, kvcache: torch.Tensor, page_size: int, ring_size: int,
                max_pos: int, dcp=None) -> None:
    """Decode / verify: every live row (raw_out_loc > 0) has a non-negative position and a ring
    inside state; every odd live row that stores has its page (raw_out_loc >> 1) inside kvcache
    and its RoPE position pos - 1 inside freqs."""
    pos, rid, raw = _host(positions), _host(req), _host(raw_out_loc)
    _validate_c2_rows("c2_norm_rope_store", raw > 0, pos, rid, raw, kvcache, state.shape[0],
                      page_size, ring_size, max_pos, dcp)


def validate_c2_prefill(positions: torch.Tensor, req: torch.Tensor, raw_out_loc: torch.Tensor,
                        extend_start_loc: torch.Tensor, extend_seq_lens: torch.Tensor,
                        state: torch.Tensor, kvcache: torch.Tensor, page_size: int,
                        ring_size: int, max_pos: int, dcp=None) -> None:
    """Extend: as validate_c2 for the live rows (raw_out_loc != 0) of every request's range,
    and the ranges inside the input."""
    op = "c2_prefill_norm_rope_store"
    pos, rid, raw = _host(positions), _host(req), _host(raw_out_loc)
    n = pos.shape[0]
    starts, lens = _host(extend_start_loc), _host(extend_seq_lens)
    bad = (starts < 0) | (lens < 0) | (starts + lens > n)
    _fail_row(op, f"(request) has a row range outside the {n} input rows", bad,
              extend_start_loc=starts, extend_seq_lens=lens)
    in_range = torch.zeros(n, dtype=torch.bool)
    for s, l in zip(starts.tolist(), lens.tolist()):
        in_range[s:s + l] = True
    _validate_c2_rows(op, in_range & (raw != 0), pos, rid, raw, kvcache, state.shape[0],
                      page_size, ring_size, max_pos, dcp)


def validate_index_k(positions: torch.Tensor, loc: torch.Tensor, cache: torch.Tensor,
                     page_size: int, ratio: int, max_pos: int, dcp=None) -> None:
    """Every row that stores (loc > 0) has its page inside cache and its group position
    pos & ~(ratio - 1) inside freqs."""
    op = "low_ratio_index_k_store"
    pos, l = _host(positions), _host(loc)
    live = l > 0
    _check_cache_rows(op, "cache", *_owned(l, live, dcp), cache.shape[0], page_size)
    _check_rope_rows(op, pos & ~(ratio - 1), live, max_pos, pos)


def validate_kv_store(loc: torch.Tensor, kvcache: torch.Tensor, page_size: int,
                      dcp=None) -> None:
    """Every row that stores (loc >= 0) has its page inside kvcache."""
    l = _host(loc)
    _check_cache_rows("kv_store", "kvcache", *_owned(l, l >= 0, dcp), kvcache.shape[0],
                      page_size)
