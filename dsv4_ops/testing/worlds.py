"""Paged test worlds: everything one batch of the compressor ops touches, built the way a
serving engine lays it out (docs/contract.md 2.1), for the tests, the benchmarks and the demo.

* a full KV pool of `page_size`-token pages scattered at random over the requests (page 0 is
  never handed out); `req_to_token` int32 `[num_req_rows, max_context]`, any row stride;
* an SWA pool of `swa_page_size`-token pages allocated page-aligned (`pos % sps == swa % sps`):
  `full_to_state` int64 maps every mapped full location to its SWA location, -1 elsewhere;
* a state buffer and compressed caches sized by `dsv4_ops.layout` (cache page i holds the
  compressed tokens of full page i: `out_loc = full_loc // compress_ratio`);
* the inputs: kv_score rows of the extended tokens, ape, the RMSNorm weight, the RoPE table.

    w = make_world("cpu", Compressor(4, 512), [(300, 300), (77, 5)])
    plan = CompressorPrefillPlan.generate(4, w.rid, w.seq_lens_cpu, w.extend_lens_cpu,
                                          w.req_to_token, w.full_to_state, w.swa_page_size,
                                          w.ring, w.num_q)
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ..layout import Compressor, kv_cache, kv_score_row_width

ROPE_DIM = 64
ROPE_THETA = 10000.0
STATE_FILLS = ("zeros", "randn", "nan", "empty")


def rope_table(max_pos: int, device=None) -> torch.Tensor:
    """The RoPE table as compress_norm_rope_store takes it: complex64 [max_pos, 32],
    `freqs[p][k] = exp(i p theta^(-2k/64))`."""
    inv = 1.0 / ROPE_THETA ** (torch.arange(0, ROPE_DIM, 2, dtype=torch.float64) / ROPE_DIM)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv
    return torch.polar(torch.ones_like(ang), ang).to(torch.complex64).to(device)


def kv_score_rows(n: int, compress_ratio: int, head_dim: int, gen: torch.Generator,
                  score_scale: float = 1.0) -> torch.Tensor:
    """n random float32 kv_score rows as a projection gives them; the score half (or the
    score quarters) scaled by `score_scale` so that the softmax is not flat."""
    width = kv_score_row_width(compress_ratio, head_dim)
    rows = torch.randn(n, width, generator=gen)
    rows[:, width // 2:] *= score_scale
    return rows


def compressor_weights(compressor: Compressor, gen: torch.Generator, norm_spread: float = 0.1
                       ) -> Tuple[torch.Tensor, torch.Tensor]:
    """(ape [window, head_dim], norm_weight [head_dim]) float32, random and fixed by `gen`."""
    ape = 0.5 * torch.randn(compressor.window, compressor.head_dim, generator=gen)
    norm_weight = 1.0 + norm_spread * torch.randn(compressor.head_dim, generator=gen)
    return ape, norm_weight


def fill_state(state: torch.Tensor, how: str, gen: Optional[torch.Generator] = None,
               head_dim: int = 0, is_online: bool = False) -> torch.Tensor:
    """Fill a state buffer in place: zeros; randn from `gen` on the host (an online state gets
    a running sum > 0);
    nan (a kernel that reads a row nobody wrote poisons its output); empty (left as is)."""
    if how not in STATE_FILLS:
        raise ValueError(f"fill_state: how must be one of {STATE_FILLS}, got {how!r}")
    if how == "zeros":
        state.zero_()
    elif how == "nan":
        state.fill_(float("nan"))
    elif how == "randn":
        values = torch.randn(state.shape, generator=gen)
        if is_online:
            values[..., head_dim:2 * head_dim].abs_().add_(1.0)
        state.copy_(values)
    return state


@dataclass
class World:
    """See the module docstring. `*_cpu` tensors are host copies of the device ones."""
    device: torch.device
    compressor: Compressor
    page_size: int
    swa_page_size: int
    cache_page_size: int
    requests: List[Tuple[int, int]]          # (seq_len, extend_len) per batch entry
    rid_cpu: torch.Tensor
    req_to_token_cpu: torch.Tensor
    full_to_state_cpu: torch.Tensor
    num_pages: int                           # full pages (== compressed-cache pages)
    num_swa_pages: int
    state_slot_offset: int
    state: torch.Tensor
    kv_in: torch.Tensor
    ape: torch.Tensor
    norm_weight: torch.Tensor
    freqs: torch.Tensor
    tensors: Dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    _caches: Dict[str, torch.Tensor] = field(default_factory=dict, repr=False)

    # -- the compressor
    @property
    def compress_ratio(self) -> int:
        return self.compressor.compress_ratio

    @property
    def head_dim(self) -> int:
        return self.compressor.head_dim

    @property
    def ring(self) -> int:
        return self.compressor.ring

    @property
    def window(self) -> int:
        return self.compressor.window

    @property
    def is_online(self) -> bool:
        return self.compressor.is_online

    @property
    def kv_score_row_width(self) -> int:
        return self.compressor.kv_score_row_width

    @property
    def input_dtype(self) -> torch.dtype:
        return self.kv_in.dtype

    @property
    def state_dtype(self) -> torch.dtype:
        return self.state.dtype

    @property
    def use_req_ring(self) -> bool:
        """The planners' use_req_ring flag (ratio 4 on a request ring)."""
        return self.compressor.addressing == "req_ring" and self.compress_ratio == 4

    # -- the batch
    @property
    def batch_size(self) -> int:
        return len(self.requests)

    @property
    def num_q(self) -> int:
        return sum(e for _, e in self.requests)

    # Host tensors of the batch are made once, like the device ones: benchmarks time calls
    # that take them, and a rebuilt tensor would add its host time to every call.
    def _host(self, name: str, make) -> torch.Tensor:
        key = "host:" + name
        if key not in self.tensors:
            self.tensors[key] = make()
        return self.tensors[key]

    @property
    def seq_lens_cpu(self) -> torch.Tensor:
        return self._host("seq_lens", lambda: torch.tensor([s for s, _ in self.requests],
                                                           dtype=torch.int64))

    @property
    def extend_lens_cpu(self) -> torch.Tensor:
        return self._host("extend_lens", lambda: torch.tensor([e for _, e in self.requests],
                                                              dtype=torch.int64))

    @property
    def q_pos_cpu(self) -> torch.Tensor:
        """Position of every query (extended) token, batch-major."""
        return torch.cat([torch.arange(s - e, s, dtype=torch.int64) for s, e in self.requests])

    @property
    def q_rid_cpu(self) -> torch.Tensor:
        """Request row of every query token."""
        return torch.cat([torch.full((e,), int(r), dtype=torch.int64)
                          for (_, e), r in zip(self.requests, self.rid_cpu.tolist())])

    @property
    def out_loc_cpu(self) -> torch.Tensor:
        """Compressed-cache destination of every query token: full_loc // ratio where a window
        closes, else -1 (what engines pass)."""
        pos, cr = self.q_pos_cpu, self.compress_ratio
        full = self.req_to_token_cpu[self.q_rid_cpu, pos].to(torch.int64)
        return torch.where((pos + 1) % cr == 0, full // cr, torch.full_like(full, -1))

    def closing_tokens(self) -> Tuple[torch.Tensor, torch.Tensor]:
        """(RoPE positions, out_loc) of every compressed token of the batch in plan order
        (batch-major, position ascending); position = the window's first position."""
        pos = self.q_pos_cpu
        closes = (pos + 1) % self.compress_ratio == 0
        return ((pos[closes] + 1 - self.compress_ratio).to(self.device),
                self.out_loc_cpu[closes].to(self.device))

    # -- device tensors (made once)
    def _dev(self, name: str, host) -> torch.Tensor:
        """The device copy of the host tensor `host()`, made on first use."""
        if name not in self.tensors:
            self.tensors[name] = host().to(self.device)
        return self.tensors[name]

    @property
    def rid(self) -> torch.Tensor:
        return self._dev("rid", lambda: self.rid_cpu)

    @property
    def req_to_token(self) -> torch.Tensor:
        if "req_to_token" not in self.tensors:  # keep the host table's row stride
            host = self.req_to_token_cpu
            wide = torch.empty((host.shape[0], host.stride(0)), dtype=host.dtype,
                               device=self.device)
            wide.copy_(host.as_strided(wide.shape, (host.stride(0), 1)))
            self.tensors["req_to_token"] = wide[:, :host.shape[1]]
        return self.tensors["req_to_token"]

    @property
    def full_to_state(self) -> torch.Tensor:
        return self._dev("full_to_state", lambda: self.full_to_state_cpu)

    @property
    def seq_lens(self) -> torch.Tensor:
        return self._dev("seq_lens", lambda: self.seq_lens_cpu)

    @property
    def extend_lens(self) -> torch.Tensor:
        return self._dev("extend_lens", lambda: self.extend_lens_cpu)

    @property
    def out_loc(self) -> torch.Tensor:
        return self._dev("out_loc", lambda: self.out_loc_cpu)

    @property
    def freqs_real(self) -> torch.Tensor:
        """The RoPE table as fp32 [max_pos, 64] (cos0, sin0, ...)."""
        return torch.view_as_real(self.freqs).flatten(-2)

    def kvcache(self, store_format: Optional[str] = None, pages: Optional[int] = None
                ) -> torch.Tensor:
        """A zeroed compressed cache (default: the compressor's format, one page per full
        page). The default one is made once and kept; others are fresh."""
        fmt = store_format or self.compressor.store_format
        if pages is not None:
            return kv_cache(fmt, pages, self.cache_page_size, device=self.device)
        if fmt not in self._caches:
            self._caches[fmt] = kv_cache(fmt, self.num_pages, self.cache_page_size,
                                         device=self.device)
        return self._caches[fmt]


def page_tables(gen: torch.Generator, *, num_req_rows: int, row_lengths: Dict[int, int],
                page_size: int, swa_page_size: int, max_context: int, row_pad: int = 0,
                row_fill: int = 0, swa_ranges: Optional[Dict[int, Tuple[int, int]]] = None,
                spare_swa_pages: int = 0, evicted_fraction: float = 0.0
                ) -> Tuple[torch.Tensor, torch.Tensor, int, int]:
    """(req_to_token, full_to_state, num_pages, num_swa_pages).

    Rows `row_lengths` (row -> tokens) get randomly scattered full pages (page 0 unused);
    req_to_token [num_req_rows, max_context] is a column slice of a table `row_pad` wider
    (filled with `row_fill`). Full pages map to shuffled SWA pages, page-aligned
    (swa_page_size divides page_size); `swa_ranges` (row -> [lo, hi) positions) maps only those tokens' pages, as an
    SWA pool that dropped older tokens. `evicted_fraction` of the mapped entries become -1."""
    if page_size % swa_page_size:
        raise ValueError(f"page_tables: swa_page_size {swa_page_size} must divide page_size "
                         f"{page_size} (page-aligned SWA pages)")
    per_row = {r: -(-n // page_size) for r, n in row_lengths.items()}
    num_pages = 1 + sum(per_row.values())
    phys = (torch.randperm(num_pages - 1, generator=gen) + 1).tolist()
    wide = torch.full((num_req_rows, max_context + row_pad), row_fill, dtype=torch.int32)
    in_page = torch.arange(page_size, dtype=torch.int64)
    for r in sorted(per_row):
        pages = torch.tensor([phys.pop() for _ in range(per_row[r])], dtype=torch.int64)
        n = min(per_row[r] * page_size, max_context)
        wide[r, :n] = (pages[:, None] * page_size + in_page).reshape(-1)[:n].to(torch.int32)
    r2t = wide[:, :max_context]
    # SWA pages of swa_page_size tokens: each one holds an aligned piece of one full page.
    sps = swa_page_size
    if swa_ranges is None:
        full_swa = torch.arange(num_pages * page_size // sps, dtype=torch.int64)
    else:
        pieces = [r2t[r, lo:hi].to(torch.int64) // sps for r, (lo, hi) in swa_ranges.items()]
        full_swa = torch.unique(torch.cat(pieces)) if pieces else torch.zeros(0, dtype=torch.int64)
    num_swa_pages = int(full_swa.numel()) + spare_swa_pages
    swa_ids = torch.randperm(num_swa_pages, generator=gen)[: full_swa.numel()]
    f2s = torch.full((num_pages * page_size,), -1, dtype=torch.int64)
    in_swa = torch.arange(sps, dtype=torch.int64)
    f2s[(full_swa[:, None] * sps + in_swa).reshape(-1)] = (swa_ids[:, None] * sps
                                                           + in_swa).reshape(-1)
    if evicted_fraction > 0:
        f2s[torch.rand(f2s.shape, generator=gen) < evicted_fraction] = -1
    return r2t, f2s, num_pages, num_swa_pages


def make_world(device, compressor: Compressor, requests: Sequence[Tuple[int, int]], *,
               rids: Optional[Sequence[int]] = None, num_req_rows: Optional[int] = None,
               page_size: int = 256, swa_page_size: Optional[int] = None,
               cache_page_size: Optional[int] = None, max_context: Optional[int] = None,
               map_all_rows: bool = False, swa_tail: Optional[int] = None,
               spare_swa_pages: int = 0, row_pad: int = 0, evicted_fraction: float = 0.0,
               state_slot_offset: int = 0, state_fill: str = "zeros",
               input_dtype: torch.dtype = torch.float32, max_pos: Optional[int] = None,
               fill_inputs: bool = True, score_scale: float = 1.0, seed: int = 0) -> World:
    """A world for `requests` ((seq_len, extend_len) per batch entry) of one compressor.

    rids: request rows of the batch (default: random distinct rows of num_req_rows, which
    defaults to batch size + 2). map_all_rows: every row gets pages for max_context tokens
    (else only the batch's rows, for their seq_len). swa_tail: only the extended tokens and
    the `swa_tail` tokens before them are in the SWA pool (default: every mapped token).
    cache_page_size defaults to page_size // ratio (at least 1). fill_inputs False leaves the
    kv_score rows uninitialised (benchmarks that only time). max_pos: RoPE table rows
    (default: longest seq_len + 1, at least 1024)."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    reqs = [(int(s), int(e)) for s, e in requests]
    if any(not 0 <= e <= s for s, e in reqs):
        raise ValueError(f"make_world: requests need 0 <= extend_len <= seq_len, got {reqs}")
    bs = len(reqs)
    num_req_rows = num_req_rows or bs + 2
    if rids is None:
        rids = torch.randperm(num_req_rows, generator=gen)[:bs].tolist()
    rids = [int(r) for r in rids]
    cr = compressor.compress_ratio
    sps = swa_page_size or page_size
    longest = max([s for s, _ in reqs] + [1])
    if max_context is None:
        max_context = -(-longest // page_size) * page_size
    lengths = ({r: max_context for r in range(num_req_rows)} if map_all_rows
               else {r: s for r, (s, _) in zip(rids, reqs)})
    ranges = None
    if swa_tail is not None:
        ranges = {r: (max(0, s - e - swa_tail), s) for r, (s, e) in zip(rids, reqs)}
    r2t, f2s, num_pages, num_swa_pages = page_tables(
        gen, num_req_rows=num_req_rows, row_lengths=lengths, page_size=page_size,
        swa_page_size=sps, max_context=max_context, row_pad=row_pad, swa_ranges=ranges,
        spare_swa_pages=spare_swa_pages, evicted_fraction=evicted_fraction)
    slots = compressor.state_slots(num_requests=num_req_rows, num_swa_pages=num_swa_pages,
                                   state_slot_offset=state_slot_offset)
    state = compressor.state_buffer(num_requests=num_req_rows, num_swa_pages=num_swa_pages,
                                    state_slot_offset=state_slot_offset, device=device)
    assert state.shape[0] == slots
    fill_state(state, state_fill, gen, compressor.head_dim, compressor.is_online)
    num_q = sum(e for _, e in reqs)
    if fill_inputs:
        kv_in = kv_score_rows(num_q, cr, compressor.head_dim, gen, score_scale)
        kv_in = kv_in.to(input_dtype).to(device)
    else:
        kv_in = torch.empty((num_q, compressor.kv_score_row_width), dtype=input_dtype,
                            device=device)
    ape, norm_weight = compressor_weights(compressor, gen)
    return World(
        device=device, compressor=compressor, page_size=page_size, swa_page_size=sps,
        cache_page_size=cache_page_size or max(1, page_size // cr), requests=reqs,
        rid_cpu=torch.tensor(rids, dtype=torch.int64), req_to_token_cpu=r2t,
        full_to_state_cpu=f2s, num_pages=num_pages, num_swa_pages=num_swa_pages,
        state_slot_offset=state_slot_offset, state=state, kv_in=kv_in, ape=ape.to(device),
        norm_weight=norm_weight.to(device),
        freqs=rope_table(max_pos or max(longest + 1, 1024), device))
