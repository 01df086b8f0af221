"""Layout and allocation helpers: the sizes of the compressor's buffers (docs/contract.md 1.1,
2, 2.1 and 4), in one place, for engines and tests to allocate what the ops expect.

    fmt = dsv4_ops.store_format_of(512)                       # "fp8_ds_mla"
    state = dsv4_ops.state_buffer(4, 512, dsv4_ops.state_slots(
        "req_ring", compress_ratio=4, ring_size=8, num_requests=16))
    cache = dsv4_ops.kv_cache(fmt, num_pages=64, page_size=64)

`Compressor` bundles the parameters of one compressor of the model and derives the same.

For V4.1: `KVLayout`, the six paged cache layouts of the V4.1 caches (byte sizes and
addressing of a token), and the ratio-2 pair-state ring (`pair_ring_size`, `state_slots(
"pair_ring", ...)`, `state_buffer(2, 512, ...)`).

    layout = dsv4_ops.KVLayout.parse("v41_fp4")
    cache = dsv4_ops.kv_cache(layout, num_pages=64, page_size=64)   # [64, layout.page_bytes(64)]
    ring = dsv4_ops.pair_ring_size(num_draft_tokens=3)              # 8
    state = dsv4_ops.state_buffer(2, 512, dsv4_ops.state_slots(
        "pair_ring", compress_ratio=2, ring_size=ring, num_requests=16))
"""
import enum
from dataclasses import dataclass
from typing import NamedTuple, Optional

import torch

RATIOS = (4, 128)
PAIR_RATIO = 2
PAIR_HEAD_DIM = 512
HEAD_DIMS = (128, 512)
ADDRESSINGS = ("swa_paged", "req_ring", "legacy", "online")
PAIR_ADDRESSING = "pair_ring"     # the ratio-2 pair-state ring of V4.1 (state_slots only)
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
# The V4.1 low-ratio index-K cache holds fp4_indexer slots: 64 code bytes + 4 exponent bytes.
INDEX_K_SLOT_BYTES = (STORE_FORMATS["fp4_indexer"].data_bytes
                      + STORE_FORMATS["fp4_indexer"].scale_stride)


class _Encoding(NamedTuple):
    """Per-token bytes of one V4.1 row encoding of 512 dims (contract V4.1 3.1): `data_bytes` of
    codes, `scale_bytes` of scale row (`scales_written` of them written), one scale per `tile`."""
    data_bytes: int
    scale_bytes: int
    scales_written: int
    tile: int


_V4 = STORE_FORMATS["fp8_ds_mla"]
_HD = _V4.head_dim
# V4 is the V4.0 fp8_ds_mla format; its tile is the 64-dim group of one UE8M0 scale.
_ENCODINGS = {
    "v4": _Encoding(_V4.data_bytes, _V4.scale_stride, _V4.scale_bytes, 64),
    "v41": _Encoding(_HD, _HD // 32, _HD // 32, 32),             # e4m3 codes, UE8M0 per 32
    "v41_fp4": _Encoding(_HD // 2, _HD // 16, _HD // 16, 16),    # e2m1 pairs, e4m3 per 16
    "uniform_fp8": _Encoding(_HD, 0, 0, _HD),                    # e4m3 codes, unit scale
}
# name -> (C++ enumerator, encoding, interleaved)
_LAYOUTS = {
    "v4": (0, "v4", False),
    "v41": (1, "v41", False),
    "v41_fp4": (2, "v41_fp4", False),
    "uniform_fp8": (3, "uniform_fp8", False),
    "v41_new": (4, "v41", True),
    "v41_fp4_new": (5, "v41_fp4", True),
}
_LAYOUT_NAMES = tuple(_LAYOUTS)


class KVLayout(str, enum.Enum):
    """The paged KV-cache layouts of V4.1 (contract V4.1 3.1), with the reference engine's names.

    Block-split pages hold the page's token data, then its scale rows; interleaved pages hold
    each token's data followed by its scales. All hold 512-dim rows.
    """
    V4 = "v4"
    V41 = "v41"
    V41_FP4 = "v41_fp4"
    UNIFORM_FP8 = "uniform_fp8"
    V41_NEW = "v41_new"
    V41_FP4_NEW = "v41_fp4_new"

    @classmethod
    def parse(cls, layout) -> "KVLayout":
        """A member from a member or its name (case-insensitive)."""
        if isinstance(layout, cls):
            return layout
        name = layout.lower() if isinstance(layout, str) else layout
        if name not in _LAYOUTS:
            _fail("KVLayout.parse", "layout", f"must be one of {_LAYOUT_NAMES}, got {layout!r}")
        return cls(name)

    @property
    def code(self) -> int:
        """The number of the C++ enumerator."""
        return _LAYOUTS[self.value][0]

    @property
    def encoding(self) -> "KVLayout":
        """The block-split layout of the same row encoding (V41_NEW -> V41)."""
        return KVLayout(_LAYOUTS[self.value][1])

    @property
    def is_interleaved(self) -> bool:
        return _LAYOUTS[self.value][2]

    @property
    def is_fp4(self) -> bool:
        return self.encoding is KVLayout.V41_FP4

    @property
    def head_dim(self) -> int:
        return _HD

    @property
    def _enc(self) -> _Encoding:
        return _ENCODINGS[_LAYOUTS[self.value][1]]

    @property
    def data_bytes(self) -> int:
        """D: bytes of a token's data."""
        return self._enc.data_bytes

    @property
    def scale_bytes(self) -> int:
        """S: bytes of a token's scale row (V4: 8, of which 7 are written)."""
        return self._enc.scale_bytes

    @property
    def scales_written(self) -> int:
        return self._enc.scales_written

    @property
    def tile_size(self) -> int:
        """Dims that share one scale."""
        return self._enc.tile

    @property
    def bytes_per_token(self) -> int:
        return self.data_bytes + self.scale_bytes

    @property
    def page_align(self) -> int:
        """Pages are padded to a multiple of this: the data row stride when block-split, the
        token stride (no padding) when interleaved."""
        return self.bytes_per_token if self.is_interleaved else self.data_bytes

    def page_bytes(self, page_size: int) -> int:
        """PB: bytes of one page of `page_size` (a power of two) tokens,
        `ceil(page_size * bytes_per_token / page_align) * page_align`."""
        ps = _check_page_size(f"KVLayout.{self.name}.page_bytes", page_size)
        return _padded(ps * self.bytes_per_token, self.page_align)

    def with_interleaved(self, interleaved: bool = True) -> "KVLayout":
        """The layout of the same encoding with the given page arrangement."""
        for member in KVLayout:
            if member.encoding is self.encoding and member.is_interleaved == interleaved:
                return member
        _fail(f"KVLayout.{self.name}.with_interleaved", "interleaved",
              f"{interleaved} has no {self.encoding.value} layout")

    def token_offsets(self, loc, page_size: int):
        """(data, scales): byte offsets of the token at cache slot `loc` (an int or an integer
        tensor) in the flattened cache `[num_pages * page_bytes]`."""
        ps = _check_page_size(f"KVLayout.{self.name}.token_offsets", page_size)
        return token_byte_offsets(loc, ps, self.data_bytes, self.scale_bytes, self.page_bytes(ps),
                                  self.is_interleaved)


def token_byte_offsets(loc, page_size: int, data_bytes: int, scale_bytes: int, page_bytes: int,
                       interleaved: bool = False):
    """(data, scales) byte offsets of slot `loc` (int or integer tensor) in a flattened paged
    cache: page `loc >> log2(page_size)`, offset `off` in it; block-split pages hold data at
    `off * data_bytes` and scales at `page_size * data_bytes + off * scale_bytes`, interleaved
    pages a token's data at `off * (data_bytes + scale_bytes)`, its scales right after."""
    ps = _check_page_size("token_byte_offsets", page_size)
    page, off = loc >> (ps.bit_length() - 1), loc & (ps - 1)
    base = page * page_bytes
    if interleaved:
        data = base + off * (data_bytes + scale_bytes)
        return data, data + data_bytes
    return base + off * data_bytes, base + ps * data_bytes + off * scale_bytes


def is_valid_kv_layout_pair(kv_layout, extra_layout) -> bool:
    """Whether a main cache of `kv_layout` may sit next to a compressed (extra) cache of
    `extra_layout` (contract V4.1 3.5): the same layout, or a V41-encoded main with a
    V41_FP4-encoded extra of the same page arrangement."""
    kv, extra = KVLayout.parse(kv_layout), KVLayout.parse(extra_layout)
    return kv is extra or (kv.encoding is KVLayout.V41 and extra.encoding is KVLayout.V41_FP4
                           and kv.is_interleaved == extra.is_interleaved)


def pair_ring_size(num_draft_tokens: int = 0) -> int:
    """Rows of one request's ratio-2 pair-state ring (contract V4.1 2.1): 2 without speculative
    decoding, else `2^bitlen(n + 1)`, the smallest power of two >= n + 2."""
    if isinstance(num_draft_tokens, bool) or not isinstance(num_draft_tokens, int) \
            or num_draft_tokens < 0:
        _fail("pair_ring_size", "num_draft_tokens", f"must be an int >= 0, got {num_draft_tokens!r}")
    return 1 << (num_draft_tokens + 1).bit_length()


# ---- decode context parallelism (contract 9; csrc/include/dsv4/dcp.h) ----------------------

def _dcp_args(fn: str, world_size, rank, interleave) -> None:
    for arg, v in (("world_size", world_size), ("interleave", interleave)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            _fail(fn, arg, f"must be an int >= 1, got {v!r}")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int)
                             or not 0 <= rank < world_size):
        _fail(fn, "rank", f"must be an int in [0, world_size = {world_size}), got {rank!r}")


def dcp_local_slot(g, world_size: int, rank: int, interleave: int = 1):
    """The local cache slot of global entry g (an int >= 0 or an integer tensor) on DCP rank
    `rank` of `world_size`, or -1 where another rank owns it: entry g belongs to rank
    `(g // interleave) % world_size` and lives at its slot
    `(g // (interleave * world_size)) * interleave + g % interleave`. world_size 1 maps every g
    to itself. The stores' ownership rule (csrc/include/dsv4/dcp.h)."""
    _dcp_args("dcp_local_slot", world_size, rank, interleave)
    block = g // interleave
    local = (block // world_size) * interleave + g % interleave
    if isinstance(g, torch.Tensor):
        return torch.where(block % world_size == rank, local, torch.full_like(local, -1))
    return local if block % world_size == rank else -1


def dcp_local_pages(num_pages: int, page_size: int, world_size: int, interleave: int = 1) -> int:
    """Pages of page_size slots each rank's cache needs to hold every entry it owns of a global
    cache of num_pages pages (the same for every rank: the largest share)."""
    _dcp_args("dcp_local_pages", world_size, None, interleave)
    ps = _check_page_size("dcp_local_pages", page_size)
    if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages < 0:
        _fail("dcp_local_pages", "num_pages", f"must be an int >= 0, got {num_pages!r}")
    blocks = -(-num_pages * ps // (interleave * world_size))  # blocks of the fullest rank
    return -(-blocks * interleave // ps)


def _fail(fn: str, arg: str, msg: str):
    raise ValueError(f"dsv4_ops.{fn}: {arg} {msg}")


def _check_ratio(fn: str, compress_ratio, pair: bool = False) -> int:
    """The V4.0 ratios (4, 128); with `pair`, also the V4.1 ratio-2 pair state (head_dim 512)."""
    if pair and compress_ratio == PAIR_RATIO:
        return PAIR_RATIO
    if compress_ratio not in RATIOS:
        allowed = "2, 4 or 128" if pair else "4 or 128"
        _fail(fn, "compress_ratio", f"must be {allowed}, got {compress_ratio!r}")
    return int(compress_ratio)


def _check_pair_head_dim(fn: str, compress_ratio: int, head_dim: int) -> None:
    if compress_ratio == PAIR_RATIO and head_dim != PAIR_HEAD_DIM:
        _fail(fn, "head_dim", f"must be {PAIR_HEAD_DIM} with compress_ratio 2, got {head_dim!r}")


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
        layouts = f" or a KVLayout {_LAYOUT_NAMES}" if fn in ("cache_page_bytes", "kv_cache") else ""
        _fail(fn, "store_format", f"must be one of {tuple(STORE_FORMATS)}{layouts}, "
                                  f"got {store_format!r}")
    return STORE_FORMATS[store_format]


def window_size(compress_ratio: int) -> int:
    """kv_score rows one compressed token pools: 8 for ratio 4 (overlapping windows), 128 for 128."""
    return 8 if _check_ratio("window_size", compress_ratio) == 4 else 128


def kv_score_row_width(compress_ratio: int, head_dim: int) -> int:
    """Elements of one kv_score input row: ratio 4 `kv_ovl|kv|score_ovl|score` (4 * head_dim),
    ratios 128 and 2 `kv|score` (2 * head_dim)."""
    fn = "kv_score_row_width"
    cr = _check_ratio(fn, compress_ratio, pair=True)
    hd = _check_head_dim(fn, head_dim)
    _check_pair_head_dim(fn, cr, hd)
    return (4 if cr == 4 else 2) * hd


def state_row_width(compress_ratio: int, head_dim: int, is_online: bool = False) -> int:
    """Elements of one state-buffer row: a raw kv_score row, or the online running state
    `max|sum|kv` (3 * head_dim, ratio 128 only)."""
    cr = _check_ratio("state_row_width", compress_ratio, pair=True)
    hd = _check_head_dim("state_row_width", head_dim)
    _check_pair_head_dim("state_row_width", cr, hd)
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
    `num_requests + state_slot_offset` (slot rid + offset, and the committed-bank slot rid);
    pair_ring (ratio 2, contract V4.1 2.1): `num_requests * ring_size + ring_size + 1` rounded up
    to even, the last row being the spare (kv = 0, score = -inf) row.
    """
    fn = "state_slots"
    cr = _check_ratio(fn, compress_ratio, pair=True)
    if addressing not in ADDRESSINGS + (PAIR_ADDRESSING,):
        _fail(fn, "addressing", f"must be one of {ADDRESSINGS + (PAIR_ADDRESSING,)}, "
                                f"got {addressing!r}")
    if (addressing == PAIR_ADDRESSING) != (cr == PAIR_RATIO):
        _fail(fn, "addressing", f"'pair_ring' is the addressing of compress_ratio 2 and only "
                                f"of it, got {addressing!r} with compress_ratio {cr}")
    if addressing == PAIR_ADDRESSING:
        ring = _check_ring(fn, addressing, cr, ring_size)
        rows = _positive(fn, "num_requests", num_requests) * ring + ring + 1
        return rows + rows % 2
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
    if compress_ratio == PAIR_RATIO and dtype != torch.float32:
        _fail(fn, "dtype", f"of the ratio-2 pair state must be torch.float32, got {dtype}")
    if dtype not in STATE_DTYPES:
        _fail(fn, "dtype", f"must be torch.float32 or torch.bfloat16, got {dtype}")
    if int(num_slots) < 0:
        _fail(fn, "num_slots", f"must be >= 0, got {num_slots}")
    if not is_online and int(num_slots) % compress_ratio:
        _fail(fn, "num_slots", f"must be a multiple of compress_ratio ({compress_ratio}): the "
                               f"ops address it in pages of {compress_ratio} rows, got {num_slots}")
    return torch.zeros((int(num_slots), width), dtype=dtype, device=device)


def _check_page_size(fn: str, page_size) -> int:
    if int(page_size) < 1 or int(page_size) & (int(page_size) - 1):
        _fail(fn, "page_size", f"must be a power of two, got {page_size}")
    return int(page_size)


def _padded(nbytes: int, align: int) -> int:
    return -(-nbytes // align) * align


def cache_page_bytes(store_format, page_size: int) -> int:
    """Bytes of one cache page of `page_size` (a power of two) tokens: the token data of the
    page, then its scales; fp8_ds_mla pages are padded to a multiple of 576 bytes.
    `store_format` may also be a KVLayout (or its name): then `KVLayout.page_bytes`."""
    fn = "cache_page_bytes"
    if isinstance(store_format, str) and store_format in _LAYOUT_NAMES:
        return KVLayout(store_format).page_bytes(page_size)
    fmt = _format(fn, store_format)
    page_size = _check_page_size(fn, page_size)
    nbytes = (fmt.data_bytes + fmt.scale_stride) * page_size
    if fmt == STORE_FORMATS["fp8_ds_mla"]:
        nbytes = _padded(nbytes, fmt.data_bytes)
    return nbytes


def kv_cache(store_format, num_pages: int, page_size: int, *, device=None) -> torch.Tensor:
    """A zeroed compressed KV cache: uint8 `[num_pages, cache_page_bytes(store_format, page_size)]`;
    `store_format` is a store format of the contract (4) or a KVLayout."""
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
