"""Fake (meta) implementations: output shapes and devices of every dsv4 op, so that the ops
trace under torch.compile / torch.export without running a kernel. Each fake makes the
argument checks of its kernel that need no data (csrc/*/..._checks.h: dtypes, shapes, devices,
scalars), with the same messages, so that meta or fake tensors are refused where the kernel
would refuse the real ones."""
import torch

from .layout import INDEX_K_SLOT_BYTES, STORE_FORMATS, KVLayout, cache_page_bytes

PLAN_RECORD_BYTES = 16   # DecodePlan, CompressPlan
WRITE_RECORD_BYTES = 8   # WritePlan
_MAX_INT32 = 2 ** 31 - 1
_MAX_QUERY_TOKENS = 65536
_MAX_BATCH = 65535
_MAX_STORE_PAGE_SIZE = 2 ** 30
_ROPE_DIM = 64


def _check(cond, op: str, arg: str, msg) -> None:
    torch._check(cond, lambda: f"dsv4.{op}: {arg} {msg() if callable(msg) else msg}")


def _dtype(t, op, arg, *allowed) -> None:
    _check(t.dtype in allowed, op, arg,
           lambda: f"must have dtype {'/'.join(str(d) for d in allowed)}, got {t.dtype}")


def _dim(t, op, arg, dim) -> None:
    _check(t.dim() == dim, op, arg, lambda: f"must be {dim}-D, got shape {list(t.shape)}")


def _contiguous(t, op, arg) -> None:
    _check(t.is_contiguous(), op, arg, lambda: f"must be contiguous (got strides {t.stride()})")


def _strided_rows(t, op, arg) -> None:
    """csrc/op_checks.h check_strided_rows: contiguous rows, any row stride that keeps them
    from overlapping."""
    _check(t.shape[1] <= 1 or t.stride(1) == 1, op, arg,
           lambda: f"must have contiguous rows (column stride 1), got strides {t.stride()}")
    _check(t.shape[0] <= 1 or t.stride(0) >= t.shape[1], op, arg,
           lambda: f"must have a row stride of at least its row width {t.shape[1]} (rows must "
                   f"not overlap), got strides {t.stride()}")


def _row_stride(t) -> int:
    return t.stride(0) if t.shape[0] > 1 else t.shape[1]


def _device(t, dev, op, arg) -> None:
    _check(t.device == dev, op, arg, lambda: f"must be on {dev}, got {t.device}")


def _ratio(cr, op) -> None:
    _check(cr in (4, 128), op, "compress_ratio", lambda: f"must be 4 or 128, got {cr}")


def _window(cr) -> int:
    return 8 if cr == 4 else 128


def _dcp(op, world_size, rank, interleave) -> None:
    """csrc/op_checks.h check_dcp: the DCP arguments of a store (contract 9)."""
    _check(world_size >= 1, op, "dcp_world_size", lambda: f"must be >= 1, got {world_size}")
    _check(0 <= rank < world_size, op, "dcp_rank",
           lambda: f"must be in [0, dcp_world_size = {world_size}), got {rank}")
    _check(interleave >= 1, op, "dcp_interleave", lambda: f"must be >= 1, got {interleave}")


def _plan_tensor(t, op, arg, record_bytes) -> None:
    _dtype(t, op, arg, torch.uint8)
    _dim(t, op, arg, 2)
    _check(t.shape[1] == record_bytes, op, arg,
           lambda: f"must have {record_bytes} bytes per record, got shape {list(t.shape)}")
    _contiguous(t, op, arg)


# ---- planners (csrc/plan/plan_checks.h) -----------------------------------------------------

def _vector(t, op, arg) -> None:
    _dtype(t, op, arg, torch.int64)
    _dim(t, op, arg, 1)


def _batch(op, req_pool_indices, seq_lens, extend_lens=None, decode=True) -> None:
    _vector(req_pool_indices, op, "req_pool_indices")
    _vector(seq_lens, op, "seq_lens")
    B = req_pool_indices.shape[0]
    _check(seq_lens.shape[0] == B, op, "seq_lens",
           lambda: f"must have one entry per request ({B}), got {seq_lens.shape[0]}")
    if extend_lens is not None:
        _vector(extend_lens, op, "extend_lens")
        _check(extend_lens.shape[0] == B, op, "extend_lens",
               lambda: f"must have one entry per request ({B}), got {extend_lens.shape[0]}")
        _device(extend_lens, seq_lens.device, op, "extend_lens")
    if decode:
        _device(seq_lens, req_pool_indices.device, op, "seq_lens")
    else:
        _check(seq_lens.device.type == "cpu" or seq_lens.device == req_pool_indices.device, op,
               "seq_lens", lambda: f"must be on the host or on the device of req_pool_indices "
                                   f"({req_pool_indices.device}), got {seq_lens.device}")


def _prefill_limits(op, batch, num_q_tokens) -> None:
    _check(0 <= num_q_tokens <= _MAX_QUERY_TOKENS, op, "num_q_tokens",
           lambda: f"must be in [0, {_MAX_QUERY_TOKENS}] (ragged ids are 16-bit), got {num_q_tokens}")
    _check(batch <= _MAX_BATCH, op, "req_pool_indices",
           lambda: f"batch size must be <= {_MAX_BATCH} (batch indices are 16-bit), got {batch}")


def _paged(op, req_to_token, full_to_state, cr, sps, ring, use_req_ring, dev) -> None:
    _ratio(cr, op)
    req_ring = use_req_ring or cr == 128
    _check(0 < ring <= _MAX_INT32, op, "ring_size", lambda: f"must be in [1, 2^31), got {ring}")
    _check(ring % cr == 0, op, "ring_size",
           lambda: f"must be a multiple of compress_ratio ({cr}), got {ring}")
    _dtype(req_to_token, op, "req_to_token", torch.int32)
    _dim(req_to_token, op, "req_to_token", 2)
    _device(req_to_token, dev, op, "req_to_token")
    _check(req_to_token.shape[1] <= 1 or req_to_token.stride(1) == 1, op, "req_to_token",
           lambda: f"must have unit column stride, got strides {req_to_token.stride()}")
    win = _window(cr)
    _check(ring >= win, op, "ring_size",
           lambda: f"must be >= the window ({win}) with "
                   f"{'request-ring' if req_ring else 'SWA-paged'} addressing, got {ring}")
    if req_ring:
        return
    _check(0 < sps <= _MAX_INT32, op, "swa_page_size", lambda: f"must be in [1, 2^31), got {sps}")
    _check(sps % ring == 0, op, "swa_page_size",
           lambda: f"must be a multiple of ring_size ({ring}), got {sps}")
    _dtype(full_to_state, op, "full_to_state", torch.int64)
    _dim(full_to_state, op, "full_to_state", 1)
    _contiguous(full_to_state, op, "full_to_state")
    _device(full_to_state, dev, op, "full_to_state")


def _online(op, state_slot_offset) -> None:
    _check(0 <= state_slot_offset <= _MAX_INT32, op, "state_slot_offset",
           lambda: f"must be in [0, 2^31), got {state_slot_offset}")


def _decode_plan(req_pool_indices):
    return req_pool_indices.new_empty((req_pool_indices.shape[0], PLAN_RECORD_BYTES), dtype=torch.uint8)


def _prefill_plans(req_pool_indices, seq_lens, num_q_tokens, write_bytes):
    plan_c = req_pool_indices.new_empty((num_q_tokens, PLAN_RECORD_BYTES), dtype=torch.uint8)
    plan_w = req_pool_indices.new_empty((num_q_tokens, write_bytes), dtype=torch.uint8)
    counts = seq_lens.new_empty((2,), dtype=torch.int32)
    return plan_c, plan_w, counts


@torch.library.register_fake("dsv4::plan_decode")
def _(req_pool_indices, req_to_token, full_to_state, seq_lens, compress_ratio, swa_page_size,
      ring_size, use_req_ring):
    op = "plan_decode"
    _batch(op, req_pool_indices, seq_lens)
    _paged(op, req_to_token, full_to_state, compress_ratio, swa_page_size, ring_size,
           use_req_ring, req_pool_indices.device)
    return _decode_plan(req_pool_indices)


@torch.library.register_fake("dsv4::plan_decode_legacy")
def _(req_pool_indices, seq_lens, compress_ratio):
    op = "plan_decode_legacy"
    _batch(op, req_pool_indices, seq_lens)
    _ratio(compress_ratio, op)
    return _decode_plan(req_pool_indices)


@torch.library.register_fake("dsv4::plan_online_decode")
def _(req_pool_indices, seq_lens, state_slot_offset):
    op = "plan_online_decode"
    _batch(op, req_pool_indices, seq_lens)
    _online(op, state_slot_offset)
    return _decode_plan(req_pool_indices)


@torch.library.register_fake("dsv4::plan_prefill")
def _(req_pool_indices, seq_lens, extend_lens, req_to_token, full_to_state, compress_ratio,
      swa_page_size, ring_size, num_q_tokens, use_req_ring):
    op = "plan_prefill"
    _batch(op, req_pool_indices, seq_lens, extend_lens, decode=False)
    _prefill_limits(op, req_pool_indices.shape[0], num_q_tokens)
    _paged(op, req_to_token, full_to_state, compress_ratio, swa_page_size, ring_size,
           use_req_ring, req_pool_indices.device)
    return _prefill_plans(req_pool_indices, seq_lens, num_q_tokens, WRITE_RECORD_BYTES)


@torch.library.register_fake("dsv4::plan_prefill_legacy")
def _(req_pool_indices, seq_lens, extend_lens, compress_ratio, num_q_tokens):
    op = "plan_prefill_legacy"
    _batch(op, req_pool_indices, seq_lens, extend_lens, decode=False)
    _prefill_limits(op, req_pool_indices.shape[0], num_q_tokens)
    _ratio(compress_ratio, op)
    return _prefill_plans(req_pool_indices, seq_lens, num_q_tokens, WRITE_RECORD_BYTES)


@torch.library.register_fake("dsv4::plan_online_prefill")
def _(req_pool_indices, seq_lens, extend_lens, num_q_tokens, state_slot_offset):
    op = "plan_online_prefill"
    _batch(op, req_pool_indices, seq_lens, extend_lens, decode=False)
    _prefill_limits(op, req_pool_indices.shape[0], num_q_tokens)
    _online(op, state_slot_offset)
    return _prefill_plans(req_pool_indices, seq_lens, num_q_tokens, PLAN_RECORD_BYTES)


# ---- compress_forward (csrc/compress/compress_checks.h) -------------------------------------

def _state_row(cr, hd, online) -> int:
    return 3 * hd if online else (4 * hd if cr == 4 else 2 * hd)


def _pooling_inputs(op, kv_score_buffer, kv_score_input, ape, head_dim, compress_ratio,
                    is_online) -> None:
    """head_dim, compress_ratio, the state, the kv_score rows and ape of an op that folds
    windows (compress_forward, compress_partials): compress_checks.h's check_pooling_inputs."""
    _check(head_dim in (128, 512), op, "head_dim", lambda: f"must be 128 or 512, got {head_dim}")
    _ratio(compress_ratio, op)
    cr, hd = compress_ratio, head_dim
    st_row = _state_row(cr, hd, is_online)
    _dtype(kv_score_buffer, op, "kv_score_buffer", torch.float32, torch.bfloat16)
    _check(kv_score_buffer.dim() >= 2 and kv_score_buffer.shape[-1] == st_row, op,
           "kv_score_buffer", lambda: f"must be [num_pages, page_rows, {st_row}], got shape "
                                      f"{list(kv_score_buffer.shape)}")
    _contiguous(kv_score_buffer, op, "kv_score_buffer")
    in_row = 4 * hd if cr == 4 else 2 * hd
    _dtype(kv_score_input, op, "kv_score_input", torch.float32, torch.bfloat16)
    _dim(kv_score_input, op, "kv_score_input", 2)
    _check(kv_score_input.shape[1] == in_row, op, "kv_score_input",
           lambda: f"must have {in_row} columns, got shape {list(kv_score_input.shape)}")
    _strided_rows(kv_score_input, op, "kv_score_input")
    if kv_score_buffer.device.type == "cuda":  # check_gpu_alignment (the rest needs addresses)
        _check(_row_stride(kv_score_input) % 4 == 0, op, "kv_score_input",
               lambda: f"must have a row stride that is a multiple of 4 elements on the GPU "
                       f"(every row must start on the vector boundary), got strides "
                       f"{kv_score_input.stride()}")
    win = _window(cr)
    _dtype(ape, op, "ape", torch.float32, torch.bfloat16, torch.float16)
    _dim(ape, op, "ape", 2)
    _check(ape.shape[0] == win and ape.shape[1] == hd, op, "ape",
           lambda: f"must be [{win}, {hd}], got shape {list(ape.shape)}")
    _contiguous(ape, op, "ape")


@torch.library.register_fake("dsv4::compress_forward")
def _(kv_score_buffer, kv_score_input, ape, plan, plan_w, out, head_dim, compress_ratio, is_online):
    _compress_forward_args("compress_forward", kv_score_buffer, kv_score_input, ape, plan, plan_w,
                           out, head_dim, compress_ratio, is_online)
    return None


def _compress_forward_args(op, kv_score_buffer, kv_score_input, ape, plan, plan_w, out, head_dim,
                           compress_ratio, is_online) -> None:
    """compress_checks.h's check_compress_forward, naming `op`."""
    _ratio(compress_ratio, op)
    _check(not is_online or compress_ratio == 128, op, "is_online",
           lambda: f"needs compress_ratio 128 (the online running state is cr = 128 only), got "
                   f"{compress_ratio}")
    _pooling_inputs(op, kv_score_buffer, kv_score_input, ape, head_dim, compress_ratio, is_online)
    hd = head_dim
    _plan_tensor(plan, op, "plan", PLAN_RECORD_BYTES)
    if plan_w is not None:
        _plan_tensor(plan_w, op, "plan_w", PLAN_RECORD_BYTES if is_online else WRITE_RECORD_BYTES)
    else:
        _check(kv_score_input.shape[0] == plan.shape[0], op, "kv_score_input",
               lambda: f"must have one row per decode plan row ({plan.shape[0]}), got "
                       f"{kv_score_input.shape[0]}")
    _dtype(out, op, "out", torch.float32, torch.bfloat16)
    _dim(out, op, "out", 2)
    _check(out.shape[0] == plan.shape[0] and out.shape[1] == hd, op, "out",
           lambda: f"must be [{plan.shape[0]}, {hd}] (plan rows x head_dim), got shape "
                   f"{list(out.shape)}")
    _contiguous(out, op, "out")
    dev = kv_score_buffer.device
    for t, arg in ((kv_score_input, "kv_score_input"), (ape, "ape"), (plan, "plan"),
                   (plan_w, "plan_w"), (out, "out")):
        if t is not None:
            _device(t, dev, op, arg)


# ---- context-parallel prefill (csrc/cp/cp_checks.h) -----------------------------------------

@torch.library.register_fake("dsv4::compress_partials")
def _(kv_score_buffer, kv_score_input, input_rows, ape, plan_c, plan_w, partials, persist_rows,
      head_dim, compress_ratio, read_state):
    op = "compress_partials"
    _pooling_inputs(op, kv_score_buffer, kv_score_input, ape, head_dim, compress_ratio, False)
    _contiguous(kv_score_input, op, "kv_score_input")
    hd = head_dim
    _dtype(input_rows, op, "input_rows", torch.int32)
    _dim(input_rows, op, "input_rows", 1)
    _contiguous(input_rows, op, "input_rows")
    _plan_tensor(plan_c, op, "plan_c", PLAN_RECORD_BYTES)
    _plan_tensor(plan_w, op, "plan_w", WRITE_RECORD_BYTES)
    windows, persist = plan_c.shape[0], plan_w.shape[0]
    _dtype(partials, op, "partials", torch.float32)
    _check(partials.dim() == 3 and tuple(partials.shape) == (3, windows, hd), op, "partials",
           lambda: f"must be [3, {windows}, {hd}] (m | s | k of every plan_c window), got shape "
                   f"{list(partials.shape)}")
    _contiguous(partials, op, "partials")
    in_row = kv_score_input.shape[1]
    _check(persist_rows.dtype == kv_score_input.dtype, op, "persist_rows",
           lambda: f"must have kv_score_input's dtype {kv_score_input.dtype}, got "
                   f"{persist_rows.dtype}")
    _check(persist_rows.dim() == 2 and tuple(persist_rows.shape) == (persist, in_row), op,
           "persist_rows", lambda: f"must be [{persist}, {in_row}] (one kv_score row per plan_w "
                                   f"record), got shape {list(persist_rows.shape)}")
    _contiguous(persist_rows, op, "persist_rows")
    _same_device(kv_score_buffer.device, op, kv_score_input=kv_score_input,
                 input_rows=input_rows, ape=ape, plan_c=plan_c, plan_w=plan_w, partials=partials,
                 persist_rows=persist_rows)
    return None


@torch.library.register_fake("dsv4::merge_partials")
def _(partials, max_m, out):
    op = "merge_partials"
    _dtype(partials, op, "partials", torch.float32)
    _check(partials.dim() == 4 and partials.shape[0] >= 1 and partials.shape[1] == 3, op,
           "partials", lambda: f"must be [ranks, 3, num_windows, head_dim] (m | s | k of each "
                               f"rank), got shape {list(partials.shape)}")
    _contiguous(partials, op, "partials")
    windows, hd = partials.shape[2], partials.shape[3]
    if max_m is not None:
        _dtype(max_m, op, "max_m", torch.float32)
        _check(max_m.dim() == 2 and tuple(max_m.shape) == (windows, hd), op, "max_m",
               lambda: f"must be [{windows}, {hd}], got shape {list(max_m.shape)}")
        _contiguous(max_m, op, "max_m")
    if out.dim() == 3:
        _dtype(out, op, "out", torch.float32)
        _check(tuple(out.shape) == (3, windows, hd), op, "out",
               lambda: f"(a merged partial) must be [3, {windows}, {hd}], got shape "
                       f"{list(out.shape)}")
    else:
        _dtype(out, op, "out", torch.float32, torch.bfloat16)
        _check(out.dim() == 2 and tuple(out.shape) == (windows, hd), op, "out",
               lambda: f"must be [{windows}, {hd}] (compressed rows) or [3, {windows}, {hd}] (a "
                       f"merged partial), got shape {list(out.shape)}")
    _contiguous(out, op, "out")
    _same_device(partials.device, op, max_m=max_m, out=out)
    return None


# ---- compress_norm_rope_store (csrc/store/store_checks.h) -----------------------------------

_STORE_HEAD_DIM = {name: fmt.head_dim for name, fmt in STORE_FORMATS.items()}


@torch.library.register_fake("dsv4::compress_norm_rope_store")
def _(kv, plan, norm_weight, freqs, out_loc, kvcache, is_decode, compress_ratio, eps, page_size,
      store_format, layout="v4", dcp_world_size=1, dcp_rank=0, dcp_interleave=1):
    _store_args("compress_norm_rope_store", kv, plan, norm_weight, freqs, out_loc, kvcache,
                compress_ratio, eps, page_size, store_format, layout, dcp_world_size, dcp_rank,
                dcp_interleave)
    return None


def _store_args(op, kv, plan, norm_weight, freqs, out_loc, kvcache, compress_ratio, eps,
                page_size, store_format, layout, dcp_world_size, dcp_rank, dcp_interleave) -> None:
    """store_checks.h's check_store_args and check_store_eps, naming `op`."""
    _dcp(op, dcp_world_size, dcp_rank, dcp_interleave)
    _check(store_format in _STORE_HEAD_DIM, op, "store_format",
           lambda: f"must be one of fp8_ds_mla, bf16, fp8_indexer, fp4_indexer, got "
                   f"'{store_format}'")
    hd = _STORE_HEAD_DIM[store_format]
    kv_layout = _layout(layout, op)
    _check(kv_layout is KVLayout.V4 or store_format == "fp8_ds_mla", op, "layout",
           lambda: f"{layout} needs store_format fp8_ds_mla (head_dim 512), got {store_format}")
    _ratio(compress_ratio, op)
    _check(1 <= page_size <= _MAX_STORE_PAGE_SIZE and page_size & (page_size - 1) == 0, op,
           "page_size", lambda: f"must be a power of two in [1, 2^30], got {page_size}")
    dev = kvcache.device
    for t, arg in ((kv, "kv"), (plan, "plan"), (norm_weight, "norm_weight"), (freqs, "freqs"),
                   (out_loc, "out_loc")):
        _device(t, dev, op, arg)
    _dtype(kv, op, "kv", torch.float32, torch.bfloat16)
    _dim(kv, op, "kv", 2)
    _check(kv.shape[1] == hd, op, "kv",
           lambda: f"must have {hd} columns (head_dim) for store_format {store_format}, got "
                   f"shape {list(kv.shape)}")
    _contiguous(kv, op, "kv")
    _plan_tensor(plan, op, "plan", PLAN_RECORD_BYTES)
    _check(plan.shape[0] == kv.shape[0], op, "plan",
           lambda: f"must have one record per kv row ({kv.shape[0]}), got {plan.shape[0]}")
    _dtype(norm_weight, op, "norm_weight", torch.float32, torch.bfloat16)
    _dim(norm_weight, op, "norm_weight", 1)
    _check(norm_weight.shape[0] == hd, op, "norm_weight",
           lambda: f"must have {hd} elements, got shape {list(norm_weight.shape)}")
    _contiguous(norm_weight, op, "norm_weight")
    _dtype(freqs, op, "freqs", torch.float32)
    _dim(freqs, op, "freqs", 2)
    _check(freqs.shape[1] == _ROPE_DIM, op, "freqs",
           lambda: f"must be [max_pos, 64] (cos, sin pairs), got shape {list(freqs.shape)}")
    _contiguous(freqs, op, "freqs")
    _dtype(out_loc, op, "out_loc", torch.int32, torch.int64)
    _dim(out_loc, op, "out_loc", 1)
    _contiguous(out_loc, op, "out_loc")
    if kv_layout is not KVLayout.V4:
        _layout_cache(kvcache, kv_layout, page_size, op)
    else:
        _dtype(kvcache, op, "kvcache", torch.uint8)
        _check(kvcache.dim() >= 1, op, "kvcache", "must have a page dimension, got a scalar")
        _contiguous(kvcache, op, "kvcache")
    if kv_layout is KVLayout.V4 and kvcache.shape[0] > 0:
        page_bytes = kvcache.numel() // kvcache.shape[0]
        need = cache_page_bytes(store_format, page_size)
        _check(page_bytes >= need, op, "kvcache",
               lambda: f"pages hold {page_bytes} bytes but store_format {store_format} with "
                       f"page_size {page_size} needs {need}")
        _check(page_bytes < cache_page_bytes(store_format, 2 * page_size), op, "page_size",
               lambda: f"{page_size} does not match kvcache: its pages of {page_bytes} bytes "
                       f"hold a larger page_size of store_format {store_format}")
    _check(0.0 <= eps <= 1.7976931348623157e308, op, "eps",
           lambda: f"(norm_eps) must be finite and >= 0, got {eps}")


# ---- compress_and_store (csrc/fused/fused_checks.h) ------------------------------------------

@torch.library.register_fake("dsv4::compress_and_store")
def _(kv_score_buffer, kv_score_input, ape, plan, plan_w, norm_weight, freqs, out_loc, kvcache,
      out, head_dim, compress_ratio, is_online, eps, page_size, store_format, layout="v4",
      dcp_world_size=1, dcp_rank=0, dcp_interleave=1):
    op = "compress_and_store"
    rows = out
    if rows is None:  # fused_rows: kv_score_input's dtype
        _check(head_dim in (128, 512), op, "head_dim",
               lambda: f"must be 128 or 512, got {head_dim}")
        _dim(plan, op, "plan", 2)
        rows = kv_score_input.new_empty((plan.shape[0], head_dim))
    _check(kvcache.device == kv_score_buffer.device, op, "kvcache",
           lambda: f"must be on {kv_score_buffer.device} (kv_score_buffer's device), got "
                   f"{kvcache.device}")
    _compress_forward_args(op, kv_score_buffer, kv_score_input, ape, plan, plan_w, rows, head_dim,
                           compress_ratio, is_online)
    _check(store_format in _STORE_HEAD_DIM, op, "store_format",
           lambda: f"must be one of fp8_ds_mla, bf16, fp8_indexer, fp4_indexer, got "
                   f"'{store_format}'")
    _check(_STORE_HEAD_DIM[store_format] == head_dim, op, "store_format",
           lambda: f"{store_format} stores rows of {_STORE_HEAD_DIM[store_format]} dims, but "
                   f"head_dim is {head_dim}")
    _store_args(op, rows, plan, norm_weight, freqs, out_loc, kvcache, compress_ratio, eps,
                page_size, store_format, layout, dcp_world_size, dcp_rank, dcp_interleave)
    return None


# ---- V4.1 ratio-1 / ratio-2 ops (csrc/low_ratio/low_ratio_checks.h) --------------------------

_LATENT_DIM = 512
_PAIR_ROW = 2 * _LATENT_DIM
_INDEX_K_DIM = 128
_MAX_RING = 2 ** 30
_LAYOUT_VALUES = tuple(m.value for m in KVLayout)


def _layout(layout, op) -> KVLayout:
    _check(layout in _LAYOUT_VALUES, op, "layout",
           lambda: f"must be one of {', '.join(_LAYOUT_VALUES)}, got '{layout}'")
    return KVLayout(layout)


def _page_size(page_size, op) -> None:
    _check(1 <= page_size <= _MAX_STORE_PAGE_SIZE and page_size & (page_size - 1) == 0, op,
           "page_size", lambda: f"must be a power of two in [1, 2^30], got {page_size}")


def _eps(eps, op) -> None:
    _check(0.0 <= eps <= 1.7976931348623157e308, op, "eps",
           lambda: f"must be finite and >= 0, got {eps}")


def _paged_cache(cache, op, arg, page_size, need, need_2x, what) -> None:
    _check(cache.dim() >= 1, op, arg, "must have a page dimension, got a scalar")
    _contiguous(cache, op, arg)
    if cache.shape[0] > 0:
        page_bytes = cache.numel() // cache.shape[0]
        _check(page_bytes >= need, op, arg,
               lambda: f"pages hold {page_bytes} bytes but {what} with page_size {page_size} "
                       f"needs {need}")
        _check(page_bytes < need_2x, op, "page_size",
               lambda: f"{page_size} does not match {arg}: its pages of {page_bytes} bytes hold "
                       f"{need_2x} bytes or more, a page_size of at least {2 * page_size} of "
                       f"{what}")


def _layout_cache(kvcache, layout: KVLayout, page_size, op) -> None:
    _dtype(kvcache, op, "kvcache", torch.uint8, torch.float8_e4m3fn)
    _paged_cache(kvcache, op, "kvcache", page_size, layout.page_bytes(page_size),
                 layout.page_bytes(2 * page_size), f"layout {layout.value}")


def _rows(t, op, arg, n, width, *dtypes) -> None:
    _dtype(t, op, arg, *dtypes)
    _dim(t, op, arg, 2)
    _check(t.shape[1] == width and (n is None or t.shape[0] == n), op, arg,
           lambda: f"must be [{'*' if n is None else n}, {width}], got shape {list(t.shape)}")
    _contiguous(t, op, arg)


def _index_vector(t, op, arg, n, *dtypes) -> None:
    _dtype(t, op, arg, *dtypes)
    _dim(t, op, arg, 1)
    _check(t.shape[0] == n, op, arg,
           lambda: f"must have one entry per row ({n}), got shape {list(t.shape)}")
    _contiguous(t, op, arg)


def _norm_weight(w, dim, op) -> None:
    _dtype(w, op, "norm_weight", torch.bfloat16, torch.float32)
    _dim(w, op, "norm_weight", 1)
    _check(w.shape[0] == dim, op, "norm_weight",
           lambda: f"must have {dim} elements, got shape {list(w.shape)}")
    _contiguous(w, op, "norm_weight")


def _freqs(freqs, op) -> None:
    _dtype(freqs, op, "freqs", torch.float32)
    _dim(freqs, op, "freqs", 2)
    _check(freqs.shape[1] == _ROPE_DIM, op, "freqs",
           lambda: f"must be [max_pos, 64] (cos, sin pairs), got shape {list(freqs.shape)}")
    _contiguous(freqs, op, "freqs")


def _same_device(dev, op, **tensors) -> None:
    for arg, t in tensors.items():
        if t is not None:
            _device(t, dev, op, arg)


_INDEX = (torch.int32, torch.int64)


@torch.library.register_fake("dsv4::c1_norm_rope_store")
def _(kv, norm_weight, eps, freqs, positions, out_loc, kvcache, page_size, layout, latent,
      dcp_world_size=1, dcp_rank=0, dcp_interleave=1):
    op = "c1_norm_rope_store"
    _dcp(op, dcp_world_size, dcp_rank, dcp_interleave)
    kv_layout = _layout(layout, op)
    _page_size(page_size, op)
    _eps(eps, op)
    _same_device(kvcache.device, op, kv=kv, norm_weight=norm_weight, freqs=freqs,
                 positions=positions, out_loc=out_loc, latent=latent)
    _rows(kv, op, "kv", None, _LATENT_DIM, torch.bfloat16)
    n = kv.shape[0]
    _norm_weight(norm_weight, _LATENT_DIM, op)
    _freqs(freqs, op)
    _index_vector(positions, op, "positions", n, *_INDEX)
    _index_vector(out_loc, op, "out_loc", n, *_INDEX)
    _layout_cache(kvcache, kv_layout, page_size, op)
    _rows(latent, op, "latent", n, _LATENT_DIM, torch.bfloat16)
    return None


def _c2(op, kv_score, state, norm_weight, eps, freqs, positions, req, raw_out_loc, kvcache,
        page_size, ring_size, draft_len, layout, latent, dcp) -> None:
    _dcp(op, *dcp)
    kv_layout = _layout(layout, op)
    _page_size(page_size, op)
    _eps(eps, op)
    _check(1 <= ring_size <= _MAX_RING and ring_size & (ring_size - 1) == 0, op, "ring_size",
           lambda: f"(the pair-state ring) must be a power of two in [1, 2^30], got {ring_size}")
    _check(draft_len >= 1, op, "draft_len", lambda: f"must be >= 1, got {draft_len}")
    _same_device(kvcache.device, op, kv_score=kv_score, state=state, norm_weight=norm_weight,
                 freqs=freqs, positions=positions, req=req, raw_out_loc=raw_out_loc,
                 latent=latent)
    _rows(kv_score, op, "kv_score", None, _PAIR_ROW, torch.float32)
    n = kv_score.shape[0]
    if draft_len > 1:
        _check(n % draft_len == 0, op, "kv_score",
               lambda: f"rows ({n}) must be a multiple of the draft length (draft_len="
                       f"{draft_len}): verify takes blocks of draft_len consecutive positions "
                       f"per request")
        _check(ring_size > draft_len, op, "ring_size",
               lambda: f"the pair-state ring (ring_size={ring_size}) must be wider than the "
                       f"draft length (draft_len={draft_len})")
    _rows(state, op, "state", None, _PAIR_ROW, torch.float32)
    _norm_weight(norm_weight, _LATENT_DIM, op)
    _freqs(freqs, op)
    _index_vector(positions, op, "positions", n, *_INDEX)
    _index_vector(req, op, "req", n, torch.int64, torch.int32)
    _index_vector(raw_out_loc, op, "raw_out_loc", n, *_INDEX)
    _layout_cache(kvcache, kv_layout, page_size, op)
    _rows(latent, op, "latent", n, _LATENT_DIM, torch.bfloat16)


@torch.library.register_fake("dsv4::c2_norm_rope_store")
def _(kv_score, state, norm_weight, eps, freqs, positions, req, raw_out_loc, kvcache, page_size,
      ring_size, draft_len, layout, latent, dcp_world_size=1, dcp_rank=0, dcp_interleave=1):
    _c2("c2_norm_rope_store", kv_score, state, norm_weight, eps, freqs, positions, req,
        raw_out_loc, kvcache, page_size, ring_size, draft_len, layout, latent,
        (dcp_world_size, dcp_rank, dcp_interleave))
    return None


@torch.library.register_fake("dsv4::c2_prefill_norm_rope_store")
def _(kv_score, state, norm_weight, eps, freqs, positions, req, raw_out_loc, extend_start_loc,
      extend_seq_lens, kvcache, page_size, ring_size, layout, latent, dcp_world_size=1,
      dcp_rank=0, dcp_interleave=1):
    op = "c2_prefill_norm_rope_store"
    _c2(op, kv_score, state, norm_weight, eps, freqs, positions, req, raw_out_loc, kvcache,
        page_size, ring_size, 1, layout, latent, (dcp_world_size, dcp_rank, dcp_interleave))
    _same_device(kvcache.device, op, extend_start_loc=extend_start_loc,
                 extend_seq_lens=extend_seq_lens)
    _dtype(extend_start_loc, op, "extend_start_loc", torch.int32)
    _dim(extend_start_loc, op, "extend_start_loc", 1)
    _contiguous(extend_start_loc, op, "extend_start_loc")
    b = extend_start_loc.shape[0]
    _index_vector(extend_seq_lens, op, "extend_seq_lens", b, torch.int32)
    return None


@torch.library.register_fake("dsv4::low_ratio_index_k_store")
def _(k, norm_weight, eps, freqs, positions, loc, cache, page_size, ratio, dcp_world_size=1,
      dcp_rank=0, dcp_interleave=1):
    op = "low_ratio_index_k_store"
    _dcp(op, dcp_world_size, dcp_rank, dcp_interleave)
    _check(ratio in (1, 2), op, "ratio", lambda: f"must be 1 or 2, got {ratio}")
    _page_size(page_size, op)
    _eps(eps, op)
    _same_device(cache.device, op, k=k, norm_weight=norm_weight, freqs=freqs,
                 positions=positions, loc=loc)
    _rows(k, op, "k", None, _INDEX_K_DIM, torch.bfloat16)
    n = k.shape[0]
    _norm_weight(norm_weight, _INDEX_K_DIM, op)
    _freqs(freqs, op)
    _index_vector(positions, op, "positions", n, *_INDEX)
    _index_vector(loc, op, "loc", n, *_INDEX)
    _dtype(cache, op, "cache", torch.uint8)
    _paged_cache(cache, op, "cache", page_size, INDEX_K_SLOT_BYTES * page_size,
                 INDEX_K_SLOT_BYTES * 2 * page_size, "the index-K cache (68 bytes a slot)")
    return None


@torch.library.register_fake("dsv4::kv_store")
def _(x, loc, freqs_rows, kvcache, page_size, layout, dcp_world_size=1, dcp_rank=0,
      dcp_interleave=1):
    op = "kv_store"
    _dcp(op, dcp_world_size, dcp_rank, dcp_interleave)
    kv_layout = _layout(layout, op)
    _page_size(page_size, op)
    _same_device(kvcache.device, op, x=x, loc=loc, freqs_rows=freqs_rows)
    _rows(x, op, "x", None, _LATENT_DIM, torch.bfloat16, torch.float32)
    n = x.shape[0]
    _index_vector(loc, op, "loc", n, *_INDEX)
    if freqs_rows is not None:
        _check(kv_layout not in (KVLayout.V4, KVLayout.UNIFORM_FP8), op, "freqs_rows",
               lambda: f"(in-kernel RoPE) is only for the V41 layouts (v41, v41_fp4, v41_new, "
                       f"v41_fp4_new), got layout {layout}")
        _rows(freqs_rows, op, "freqs_rows", n, _ROPE_DIM, torch.float32)
    _layout_cache(kvcache, kv_layout, page_size, op)
    return None


# ---- speculative decoding with the online cr = 128 state (csrc/spec/spec_checks.h) ----------

def _spec_index(t, op, arg, batch, dev) -> None:
    _dtype(t, op, arg, *_INDEX)
    _dim(t, op, arg, 1)
    _contiguous(t, op, arg)
    _device(t, dev, op, arg)
    _check(batch <= t.shape[0], op, arg,
           lambda: f"has {t.shape[0]} entries, fewer than batch_size {batch}")


def _spec_req_to_token(t, op, dev) -> None:
    _dtype(t, op, "req_to_token", torch.int32)
    _dim(t, op, "req_to_token", 2)
    _device(t, dev, op, "req_to_token")


def _spec_pending(t, op, num_req_slots, dev) -> None:
    _dtype(t, op, "pending_seq_lens", torch.int64)
    _dim(t, op, "pending_seq_lens", 1)
    _contiguous(t, op, "pending_seq_lens")
    _device(t, dev, op, "pending_seq_lens")
    _check(0 <= num_req_slots <= t.shape[0], op, "num_req_slots",
           lambda: f"must lie in [0, {t.shape[0]}] (the entries of pending_seq_lens), got "
                   f"{num_req_slots}")


def _spec_state(state, op, head_dim) -> None:
    _check(head_dim in (128, 512), op, "head_dim", lambda: f"must be 128 or 512, got {head_dim}")
    _dtype(state, op, "state", torch.float32, torch.bfloat16)
    _check(state.dim() >= 2 and state.shape[-1] == 3 * head_dim, op, "state",
           lambda: f"must be [num_slots, {3 * head_dim}] (m | S | K rows, any leading shape), "
                   f"got shape {list(state.shape)}")
    _contiguous(state, op, "state")


def _spec_verify(op, num_verify_tokens, state_slot_stride) -> None:
    _check(num_verify_tokens >= 1, op, "num_verify_tokens",
           lambda: f"must be at least 1, got {num_verify_tokens}")
    _check(state_slot_stride >= 1, op, "state_slot_stride",
           lambda: f"must be at least 1, got {state_slot_stride}")


@torch.library.register_fake("dsv4::online_c128_mtp_write_prefix_states")
def _(kv_score_input, seq_lens, req_pool_indices, req_to_token, ape, state, batch_size,
      num_verify_tokens, state_slot_stride, head_dim):
    op = "online_c128_mtp_write_prefix_states"
    _spec_state(state, op, head_dim)
    dev = state.device
    _dtype(kv_score_input, op, "kv_score_input", torch.float32, torch.bfloat16)
    _dim(kv_score_input, op, "kv_score_input", 2)
    _check(kv_score_input.shape[1] == 2 * head_dim, op, "kv_score_input",
           lambda: f"must have {2 * head_dim} columns (kv | score), got shape "
                   f"{list(kv_score_input.shape)}")
    _strided_rows(kv_score_input, op, "kv_score_input")
    _device(kv_score_input, dev, op, "kv_score_input")
    _dtype(ape, op, "ape", torch.float32, torch.bfloat16, torch.float16)
    _check(ape.dim() == 2 and tuple(ape.shape) == (128, head_dim), op, "ape",
           lambda: f"must be [128, {head_dim}], got shape {list(ape.shape)}")
    _contiguous(ape, op, "ape")
    _device(ape, dev, op, "ape")
    _spec_req_to_token(req_to_token, op, dev)
    batch = max(batch_size, 0)
    _spec_index(seq_lens, op, "seq_lens", batch, dev)
    _spec_index(req_pool_indices, op, "req_pool_indices", batch, dev)
    _spec_verify(op, num_verify_tokens, state_slot_stride)
    _check(batch * num_verify_tokens <= kv_score_input.shape[0], op, "kv_score_input",
           lambda: f"has {kv_score_input.shape[0]} rows, fewer than batch_size x "
                   f"num_verify_tokens = {batch * num_verify_tokens}")
    return None


@torch.library.register_fake("dsv4::online_c128_mtp_mark_pending")
def _(seq_lens, req_pool_indices, pending_seq_lens, batch_size, num_req_slots):
    op = "online_c128_mtp_mark_pending"
    dev = pending_seq_lens.device
    batch = max(batch_size, 0)
    _spec_pending(pending_seq_lens, op, num_req_slots, dev)
    _spec_index(seq_lens, op, "seq_lens", batch, dev)
    _spec_index(req_pool_indices, op, "req_pool_indices", batch, dev)
    return None


@torch.library.register_fake("dsv4::online_c128_mtp_commit_pending")
def _(seq_lens, req_pool_indices, req_to_token, pending_seq_lens, state, batch_size,
      num_verify_tokens, state_slot_stride, num_req_slots, head_dim):
    op = "online_c128_mtp_commit_pending"
    _spec_state(state, op, head_dim)
    dev = state.device
    batch = max(batch_size, 0)
    _spec_index(seq_lens, op, "seq_lens", batch, dev)
    _spec_index(req_pool_indices, op, "req_pool_indices", batch, dev)
    _spec_req_to_token(req_to_token, op, dev)
    _spec_pending(pending_seq_lens, op, num_req_slots, dev)
    _spec_verify(op, num_verify_tokens, state_slot_stride)
    return None
