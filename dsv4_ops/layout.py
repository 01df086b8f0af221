"""Layout and allocation helpers: the sizes of the compressor's buffers (docs/contract.md 1.1,
2, 2.1 and 4), in one place, for engines and tests to allocate what the ops expect.

    fmt = dsv4_ops.store_format_of(512)                       # "fp8_ds_mla"
    state = dsv4_ops.state_buffer(4, 512, dsv4_ops.state_slots(
        "req_ring", compress_ratio=4, ring_size=8, num_requests=16))
    cache = dsv4_ops.kv_cache(fmt, num_pages=64, page_size=64)

`Compressor` bundles the parameters of one compressor of the model and derives the same.
"""
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

RATIOS = (4, 128)
HEAD_DIMS = (128, 512)
ADDRESSINGS = ("swa_paged", "req_ring", "legacy", "online")
STATE_DTYPES = (torch.float32, torch.bfloat16)


class StoreFormat(NamedTuple):
    """Byte layout of one token in a cache page (contract 4): token data at `off * data_bytes`,
    its scales at `page_size * data_bytes + off * scale_stride` (`scale_bytes` written)."""
    head_dim: int
    data_bytes: int
    scale_bytes: int
    scale_stride: int


STORE_FORMATS = {
    "fp8_ds_mla": StoreFormat(512, 576, 7, 8),
    "bf16": StoreFormat(512, 1024, 0, 0),
    "fp8_indexer": StoreFormat(128, 128, 4, 4),
    "fp4_indexer": StoreFormat(128, 64, 4, 4),
}


def _fail(fn: str, arg: str, msg: str):
    raise ValueError(f"dsv4_ops.{fn}: {arg} {msg}")


def _check_ratio(fn: str, compress_ratio) -> int:
    if compress_ratio not in RATIOS:
        _fail(fn, "compress_ratio", f"must be 4 or 128, got {compress_ratio!r}")
    return int(compress_ratio)


def _check_head_dim(fn: str, head_dim) -> int:
    if head_dim not in HEAD_DIMS:
        _fail(fn, "head_dim", f"must be 128 or 512, got {head_dim!r}")
    return int(head_dim)


def _check_online(fn: str, compress_ratio: int, is_online: bool) -> None:
    if is_online and compress_ratio != 128:
        _fail(fn, "is_online", f"needs compress_ratio 128, got {compress_ratio}")


def _format(fn: str, store_format) -> StoreFormat:
    if isinstance(store_format, StoreFormat):
        return store_format
    if store_format not in STORE_FORMATS:
        _fail(fn, "store_format", f"must be one of {tuple(STORE_FORMATS)}, got {store_format!r}")
    return STORE_FORMATS[store_format]


def window_size(compress_ratio: int) -> int:
    """kv_score rows one compressed token pools: 8 for ratio 4 (overlapping windows), 128 for 128."""
    return 8 if _check_ratio("window_size", compress_ratio) == 4 else 128


def kv_score_row_width(compress_ratio: int, head_dim: int) -> int:
    """Elements of one kv_score input row: ratio 4 `kv_ovl|kv|score_ovl|score` (4 * head_dim),
    ratio 128 `kv|score` (2 * head_dim)."""
    cr = _check_ratio("kv_score_row_width", compress_ratio)
    return (4 if cr == 4 else 2) * _check_head_dim("kv_score_row_width", head_dim)


def state_row_width(compress_ratio: int, head_dim: int, is_online: bool = False) -> int:
    """Elements of one state-buffer row: a raw kv_score row, or the online running state
    `max|sum|kv` (3 * head_dim, ratio 128 only)."""
    cr = _check_ratio("state_row_width", compress_ratio)
    hd = _check_head_dim("state_row_width", head_dim)
    _check_online("state_row_width", cr, is_online)
    return 3 * hd if is_online else kv_score_row_width(cr, hd)


def _positive(fn: str, arg: str, value) -> int:
    if value is None:
        _fail(fn, arg, "is required for this addressing")
    if int(value) < 1:
        _fail(fn, arg, f"must be >= 1, got {value}")
    return int(value)


def state_slots(addressing: str, *, compress_ratio: int, ring_size: Optional[int] = None,
                num_requests: Optional[int] = None, num_swa_pages: Optional[int] = None,
                state_slot_offset: int = 0) -> int:
    """Rows (slots) a state buffer needs so that every slot of contract 2.1 lies inside it.

    swa_paged (ratio 4): `num_swa_pages * ring_size`; req_ring: `num_requests * ring_size`
    (request rows 0..num_requests-1); legacy: `num_requests * window`; online (ratio 128):
    `num_requests + state_slot_offset` (slot rid + offset, and the committed-bank slot rid).
    """
    fn = "state_slots"
    cr = _check_ratio(fn, compress_ratio)
    if addressing not in ADDRESSINGS:
        _fail(fn, "addressing", f"must be one of {ADDRESSINGS}, got {addressing!r}")
    if addressing == "online":
        _check_online(fn, cr, True)
        if state_slot_offset < 0:
            _fail(fn, "state_slot_offset", f"must be >= 0, got {state_slot_offset}")
        return _positive(fn, "num_requests", num_requests) + int(state_slot_offset)
    if addressing == "legacy":
        if ring_size not in (None, window_size(cr)):
            _fail(fn, "ring_size", f"of legacy addressing is the window ({window_size(cr)}), "
                                   f"got {ring_size}")
        return _positive(fn, "num_requests", num_requests) * window_size(cr)
    ring = _check_ring(fn, addressing, cr, ring_size)
    if addressing == "swa_paged":
        return _positive(fn, "num_swa_pages", num_swa_pages) * ring
    return _positive(fn, "num_requests", num_requests) * ring


def _check_ring(fn: str, addressing: str, cr: int, ring_size) -> int:
    """The planners' rules for a ring (swa_paged: ratio 4; req_ring: at least the window)."""
    ring = _positive(fn, "ring_size", ring_size)
    if ring % cr:
        _fail(fn, "ring_size", f"must be a multiple of compress_ratio ({cr}), got {ring}")
    if addressing == "swa_paged" and cr != 4:
        _fail(fn, "addressing", f"'swa_paged' needs compress_ratio 4, got {cr}")
    if addressing == "req_ring" and ring < window_size(cr):
        _fail(fn, "ring_size", f"must be >= the window ({window_size(cr)}) with request-ring "
                               f"addressing, got {ring}")
    return ring


def state_buffer(compress_ratio: int, head_dim: int, num_slots: int, *, is_online: bool = False,
                 dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """A zeroed state buffer ("kv_score_buffer") `[num_slots, state_row_width]` of `dtype`
    (fp32 or bf16). compress_forward takes it as is (or any view with the same last dim)."""
    fn = "state_buffer"
    width = state_row_width(compress_ratio, head_dim, is_online)
    if dtype not in STATE_DTYPES:
        _fail(fn, "dtype", f"must be torch.float32 or torch.bfloat16, got {dtype}")
    if int(num_slots) < 0:
        _fail(fn, "num_slots", f"must be >= 0, got {num_slots}")
    if not is_online and int(num_slots) % compress_ratio:
        _fail(fn, "num_slots", f"must be a multiple of compress_ratio ({compress_ratio}): the "
                               f"ops address it in pages of {compress_ratio} rows, got {num_slots}")
    return torch.zeros((int(num_slots), width), dtype=dtype, device=device)


def cache_page_bytes(store_format, page_size: int) -> int:
    """Bytes of one cache page of `page_size` (a power of two) tokens: the token data of the
    page, then its scales; fp8_ds_mla pages are padded to a multiple of 576 bytes."""
    fn = "cache_page_bytes"
    fmt = _format(fn, store_format)
    if int(page_size) < 1 or int(page_size) & (int(page_size) - 1):
        _fail(fn, "page_size", f"must be a power of two, got {page_size}")
    nbytes = (fmt.data_bytes + fmt.scale_stride) * int(page_size)
    if fmt == STORE_FORMATS["fp8_ds_mla"]:
        nbytes = -(-nbytes // fmt.data_bytes) * fmt.data_bytes
    return nbytes


def kv_cache(store_format, num_pages: int, page_size: int, *, device=None) -> torch.Tensor:
    """A zeroed compressed KV cache: uint8 `[num_pages, cache_page_bytes(store_format, page_size)]`."""
    nbytes = cache_page_bytes(store_format, page_size)
    if int(num_pages) < 0:
        _fail("kv_cache", "num_pages", f"must be >= 0, got {num_pages}")
    return torch.zeros((int(num_pages), nbytes), dtype=torch.uint8, device=device)


@dataclass(frozen=True)
class Compressor:
    """One compressor of the model: its ratio, head_dim, cache format and state addressing.

    store_format None picks the default of the head_dim (fp8_ds_mla for 512, fp8_indexer for
    128); addressing None picks swa_paged for ratio 4 and req_ring for 128; ring_size None
    picks the window (legacy: always the window; online: one slot per request).
    """
    compress_ratio: int
    head_dim: int
    store_format: Optional[str] = None
    addressing: Optional[str] = None
    ring_size: Optional[int] = None
    state_dtype: torch.dtype = torch.float32

    def __post_init__(self):
        fn = "Compressor"
        cr = _check_ratio(fn, self.compress_ratio)
        hd = _check_head_dim(fn, self.head_dim)
        fmt = self.store_format or ("fp8_indexer" if hd == 128 else "fp8_ds_mla")
        if _format(fn, fmt).head_dim != hd:
            _fail(fn, "store_format", f"{fmt!r} does not hold head_dim {hd}")
        addressing = self.addressing or ("swa_paged" if cr == 4 else "req_ring")
        if addressing not in ADDRESSINGS:
            _fail(fn, "addressing", f"must be one of {ADDRESSINGS}, got {addressing!r}")
        if addressing == "online":
            _check_online(fn, cr, True)
        if addressing in ("legacy", "online") and self.ring_size not in (None, self.ring):
            _fail(fn, "ring_size", f"of {addressing} addressing is {self.ring}, got {self.ring_size}")
        if self.state_dtype not in STATE_DTYPES:
            _fail(fn, "state_dtype", f"must be torch.float32 or torch.bfloat16, got {self.state_dtype}")
        object.__setattr__(self, "store_format", fmt)
        object.__setattr__(self, "addressing", addressing)
        if addressing in ("swa_paged", "req_ring"):
            _check_ring(fn, addressing, cr, self.ring)

    @property
    def window(self) -> int:
        return window_size(self.compress_ratio)

    @property
    def ring(self) -> int:
        """State rows per ring: ring_size (default the window); legacy the window; online 1."""
        if self.addressing == "online":
            return 1
        if self.addressing == "legacy":
            return self.window
        return self.ring_size or self.window

    @property
    def is_online(self) -> bool:
        return self.addressing == "online"

    @property
    def kv_score_row_width(self) -> int:
        return kv_score_row_width(self.compress_ratio, self.head_dim)

    @property
    def state_row_width(self) -> int:
        return state_row_width(self.compress_ratio, self.head_dim, self.is_online)

    @property
    def use_fp4(self) -> bool:
        """compress_norm_rope_store's flag for this store format."""
        return self.store_format == "fp4_indexer"

    @property
    def bf16_store(self) -> bool:
        return self.store_format == "bf16"

    def state_slots(self, *, num_requests: Optional[int] = None,
                    num_swa_pages: Optional[int] = None, state_slot_offset: int = 0) -> int:
        return state_slots(self.addressing, compress_ratio=self.compress_ratio,
                           ring_size=self.ring if not self.is_online else None,
                           num_requests=num_requests, num_swa_pages=num_swa_pages,
                           state_slot_offset=state_slot_offset)

    def state_buffer(self, *, num_requests: Optional[int] = None,
                     num_swa_pages: Optional[int] = None, state_slot_offset: int = 0,
                     device=None) -> torch.Tensor:
        """The zeroed state buffer that holds every slot of the given requests / SWA pages."""
        slots = self.state_slots(num_requests=num_requests, num_swa_pages=num_swa_pages,
                                 state_slot_offset=state_slot_offset)
        return state_buffer(self.compress_ratio, self.head_dim, slots, is_online=self.is_online,
                            dtype=self.state_dtype, device=device)

    def cache_page_bytes(self, page_size: int) -> int:
        return cache_page_bytes(self.store_format, page_size)

    def kv_cache(self, num_pages: int, page_size: int, *, device=None) -> torch.Tensor:
        return kv_cache(self.store_format, num_pages, page_size, device=device)
