"""A small simulated serving engine around the dsv4_ops compressor API.

This module plays the part of an inference server's attention backend for the KV-cache
compressors of DeepSeek-V4, with plain PyTorch bookkeeping around the dsv4_ops calls. It is
both an end-to-end test harness and an example of how an engine drives the API:

* a paged token pool: ``req_to_token`` (int32 ``[rows, max_context]``) maps each request
  position to a location in the full KV pool, pages of ``page_size`` tokens scattered at random;
* a sliding-window (SWA) pool: ``full_to_state`` (int64) maps full locations to SWA locations,
  pages of ``swa_page_size`` tokens allocated page-aligned (``pos % sps == swa % sps``);
* one state buffer ("kv_score_buffer") per compressor (docs/contract.md 2) and one compressed KV cache per
  compressor (uint8 ``[pages, page_bytes]``, cache page ``i`` holding the compressed tokens of
  full page ``i``: ``out_loc = full_loc // cr``, cache page size ``page_size // cr``);
* requests that carry their whole kv_score history (random rows per token and compressor, as
  the model's projection would produce them).

``ServingSimulator.step(batch)`` runs one forward step: ``batch`` is a list of
``(request, n_new_tokens)``; a decode step has ``n_new_tokens == 1`` for everyone, a
prefill/extend step any ``n >= 0``. For every configured compressor the step builds the plan
(``CompressorDecodePlan`` / ``CompressorPrefillPlan``, one plan per ratio and addressing, shared
by all compressors that use it, as one plan serves every layer), runs ``compress_and_store``
(``compress_forward`` and ``compress_norm_rope_store`` in one op, contract 11), and then
(``check=True``) verifies the step against the
whole-sequence oracle ``dsv4_ops.testing.reference``:

* every compressed token of the step against ``reference.compressed_tokens`` of the request's
  history (rows that close no window must be zeros);
* every byte of the compressed cache: the windows closed in the step against a shadow written by
  ``reference.store`` (with contract 4's conformance slack), every other byte untouched;
* every state-buffer row: rows the step persists hold the input row (offline) or the running
  state of ``reference.online_state`` (online cr = 128); all other rows untouched.

Typical use::

    sim = ServingSimulator(deepseek_v4_compressors(), device="cuda")
    a, b = sim.add_request(), sim.add_request()
    sim.step([(a, 300), (b, 77)])            # prefill
    for _ in range(10):
        sim.step([(a, 1), (b, 1)])           # decode
    sim.step([(a, 5), (b, 0)])               # extend (b idles in the batch)

Speculative decoding (``speculative=True``: rings 16 / 256) verifies ``w`` draft tokens with an
extend step and then keeps ``k`` of them with ``sim.truncate(request, length)``. An online
cr = 128 compressor then keeps ``1 + MAX_VERIFY`` banks of state slots and a ``"verify"`` step
(every request the same width) runs the draft ops of contract 10: ``commit_pending`` at the start
of the next step, ``mark_pending``, the online verify plan and ``write_prefix_states``
(:class:`_OnlineDrafts`); the checker expects each bank to hold the online state after its
verify token and the committed slot the state of the accepted prefix. With
``use_cuda_graph=True`` the prefill plans are padded to ``num_q_tokens`` rows (more than the
real token count) and decode batches are padded with a dummy request, as CUDA-graph replay
does; ``lengths_on_device=True`` hands the planners device-side lengths.
"""
from __future__ import annotations

import dataclasses
import math
import random
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from . import reference, worlds
from ..compressor import compress_and_store
from ..layout import STORE_FORMATS, Compressor, kv_score_row_width, window_size
from ..plans import CompressorDecodePlan, CompressorPrefillPlan
from .. import spec as _spec

# Verify tokens a speculative simulator's online state has banks for (7 drafts + the bonus).
MAX_VERIFY = 8


class SimulationMismatch(AssertionError):
    """A step disagreed with the reference; the message lists every mismatch found."""


# ------------------------------------------------------------------------------------------
# Configuration
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CompressorConfig(Compressor):
    """One compressor of the model (the simulator keeps one state buffer and one cache each):
    its layout (a dsv4_ops.Compressor, see its defaults), its name and the dtypes the engine
    feeds, e.g. ``CompressorConfig(4, 128, "fp4_indexer", name="c4_indexer_fp4")``.

    addressing: "swa_paged" (cr = 4 only), "req_ring", "legacy" or "online" (cr = 128 only).
    ring_size: None picks the window (8 / 128), doubled when the simulator is speculative.
    out_dtype: compress_forward's output dtype (None: the input dtype, the API's default).
    """
    name: str = field(kw_only=True)
    input_dtype: torch.dtype = field(default=torch.float32, kw_only=True)
    out_dtype: Optional[torch.dtype] = field(default=None, kw_only=True)
    ape_dtype: torch.dtype = field(default=torch.float32, kw_only=True)
    norm_eps: float = field(default=1e-6, kw_only=True)

    def __post_init__(self):
        try:
            super().__post_init__()
        except ValueError as e:
            raise ValueError(f"{self.name}: {e}") from None

    def layout(self, speculative: bool = False) -> "CompressorConfig":
        """The compressor with its ring resolved: a ring-addressed one without ring_size gets
        twice the window when `speculative` (room for draft tokens)."""
        if self.ring_size is None and speculative and self.addressing in ("swa_paged", "req_ring"):
            return dataclasses.replace(self, ring_size=2 * self.window)
        return self


def deepseek_v4_compressors(*, indexer_stores: Sequence[str] = ("fp8_indexer",),
                            main_store: str = "fp8_ds_mla", c4_addressing: str = "swa_paged",
                            c128_addressing: str = "req_ring",
                            state_dtype: torch.dtype = torch.float32,
                            input_dtype: torch.dtype = torch.float32) -> List[CompressorConfig]:
    """The compressors of DeepSeek-V4: the cr = 4 indexer (hd 128, one per indexer store
    format), the cr = 4 main compressor and the cr = 128 main compressor (hd 512)."""
    common = dict(state_dtype=state_dtype, input_dtype=input_dtype)
    out = [CompressorConfig(4, 128, fmt, c4_addressing, name=f"c4_indexer_{fmt.split('_')[0]}",
                            **common) for fmt in indexer_stores]
    out.append(CompressorConfig(4, 512, main_store, c4_addressing, name="c4_main", **common))
    out.append(CompressorConfig(128, 512, main_store, c128_addressing, name="c128_main", **common))
    return out


# ------------------------------------------------------------------------------------------
# Requests
# ------------------------------------------------------------------------------------------
class _Rows:
    """A growable float32 [n, width] host tensor (amortised appends, cheap truncation)."""

    def __init__(self, width: int, capacity: int = 64):
        self._buf = torch.empty(capacity, width)
        self.n = 0

    def append(self, rows: torch.Tensor) -> None:
        need = self.n + rows.shape[0]
        if need > self._buf.shape[0]:
            grown = torch.empty(max(need, 2 * self._buf.shape[0]), self._buf.shape[1])
            grown[: self.n] = self._buf[: self.n]
            self._buf = grown
        self._buf[self.n:need] = rows
        self.n = need

    def truncate(self, n: int) -> None:
        self.n = min(self.n, n)

    def get(self, start: int = 0, end: Optional[int] = None) -> torch.Tensor:
        return self._buf[start:self.n if end is None else end]

    def prefix_copy(self, n: int) -> "_Rows":
        rows = _Rows(self._buf.shape[1], max(n, 64))
        rows.append(self._buf[:n])
        return rows


@dataclass(eq=False)
class Request:
    """A request: its request-pool row, its length and its kv_score history per compressor."""
    rid: int
    name: str
    seq_len: int = 0
    history: Dict[str, _Rows] = field(default_factory=dict, repr=False)
    full_pages: Dict[int, int] = field(default_factory=dict, repr=False)  # page idx -> pool page
    swa_pages: Dict[int, int] = field(default_factory=dict, repr=False)   # page idx -> SWA page
    evicted_swa: int = 0           # SWA page indices below this are evicted
    rollback_floor: int = 0        # truncate() may not go below this length
    last_width: int = 0            # tokens of the last step (verify width for truncate)
    last_kind: str = ""            # kind of the last step ("verify": online banks are staged)
    reference_tokens: Dict[str, Dict[int, torch.Tensor]] = field(default_factory=dict, repr=False)
    finished: bool = False


# ------------------------------------------------------------------------------------------
# Step results
# ------------------------------------------------------------------------------------------
@dataclass
class CompressorReport:
    name: str
    compressed: int = 0            # compressed tokens produced (windows closed) in the step
    max_abs_err: float = 0.0       # vs reference.compressed_tokens
    cache_bytes_checked: int = 0   # bytes of the windows written (the rest is checked untouched)
    state_rows_checked: int = 0    # state rows the step persisted
    code_slack: int = 0            # quantised codes one step away from the shadow (contract 4 slack)


@dataclass
class StepResult:
    index: int
    kind: str                      # "decode" | "extend" (prefill / verify are extends)
    num_requests: int
    num_tokens: int
    outputs: Dict[str, torch.Tensor]          # compressed rows (compress_and_store's out)
    events: Dict[str, List[Tuple[str, int, int]]]  # (request name, token index k, output row)
    reports: Dict[str, CompressorReport]
    op_seconds: float
    check_seconds: float
    failures: List[str]

    @property
    def ok(self) -> bool:
        return not self.failures


@dataclass
class _Event:
    """A window closing in this step: output row `row`, ragged input row `ragged`."""
    req: Request
    seq_len: int
    row: int
    ragged: int
    loc: int


# ------------------------------------------------------------------------------------------
# Per-compressor runtime state
# ------------------------------------------------------------------------------------------
class _Compressor:
    def __init__(self, cfg: CompressorConfig, sim: "ServingSimulator", gen: torch.Generator):
        self.cfg = cfg
        cr, hd, dev = cfg.compress_ratio, cfg.head_dim, sim.device
        try:
            layout = cfg.layout(sim.speculative)
        except ValueError as e:
            raise ValueError(f"{cfg.name}: {e}") from None
        self.layout, self.ring = layout, layout.ring
        if cfg.addressing == "swa_paged":
            if self.ring < cfg.window:
                raise ValueError(f"{cfg.name}: ring_size {self.ring} must be at least the "
                                 f"window {cfg.window}")
            if sim.swa_page_size % self.ring:
                raise ValueError(f"{cfg.name}: swa_page_size {sim.swa_page_size} must be a "
                                 f"multiple of ring_size {self.ring}")
        # pad: rows past the last closed window that a prefill keeps for draft tokens (contract 3.3)
        ring_planner = cfg.addressing in ("swa_paged", "req_ring")
        self.pad = self.ring - cfg.window + 2 if ring_planner and self.ring > cfg.window else 0
        # The flat state buffer and the view the ops take (contract 2). It starts as NaN: a kernel
        # that reads a row nobody wrote (e.g. the absent rows of the first cr = 4 window,
        # whatever page the record names) poisons its output.
        # Online and speculative: 1 + MAX_VERIFY banks of num_req_rows slots (contract 10.2).
        self.bank_stride = sim.num_req_rows if cfg.is_online and sim.speculative else 0
        self.state = worlds.fill_state(
            layout.state_buffer(num_requests=sim.num_req_rows, num_swa_pages=sim.num_swa_pages,
                                state_slot_offset=self.bank_stride * MAX_VERIFY,
                                device=dev), "nan")
        slots, width = self.state.shape
        self.state_view = self.state.view(slots, 1, width) if cfg.is_online else \
            self.state.view(slots // cr, cr, width)
        # Weights (random, fixed per compressor).
        ape, self.norm_weight = worlds.compressor_weights(layout, gen, norm_spread=0.2)
        self.ape = ape.to(cfg.ape_dtype)
        self.ape_dev, self.norm_weight_dev = self.ape.to(dev), self.norm_weight.to(dev)
        self.freqs_cis = sim.freqs_cis
        # The compressed KV cache: cache page i holds the compressed tokens of full page i.
        # It starts as random bytes, so that any byte a kernel writes out of turn shows.
        self.cache_page_size = sim.page_size // cr
        self.page_bytes = layout.cache_page_bytes(self.cache_page_size)
        self.cache = torch.randint(0, 256, (sim.num_pages, self.page_bytes), generator=gen,
                                   dtype=torch.uint8).to(dev)
        self.plan_key = (cr, cfg.addressing, self.ring)

    def slot(self, sim: "ServingSimulator", rid: int, pos: int) -> int:
        """State slot of (request row, position) by contract 2.1 (the reference's helper)."""
        return reference.state_slot(
            self.cfg.addressing, rid, pos, compress_ratio=self.cfg.compress_ratio,
            ring_size=self.ring, swa_page_size=sim.swa_page_size,
            req_to_token=sim.req_to_token_host, full_to_state=sim.full_to_state_host)


# ------------------------------------------------------------------------------------------
# The simulator
# ------------------------------------------------------------------------------------------
class ServingSimulator:
    """See the module docstring. All bookkeeping is on the host; the ops run on `device`."""

    def __init__(self, compressors: Sequence[CompressorConfig], *, device="cpu",
                 page_size: int = 256, swa_page_size: int = 64, max_requests: int = 8,
                 max_context: int = 2048, num_pages: Optional[int] = None,
                 num_swa_pages: Optional[int] = None, speculative: bool = False,
                 use_cuda_graph: bool = False, lengths_on_device: bool = False,
                 out_loc_dtype: torch.dtype = torch.int64, swa_window: Optional[int] = None,
                 score_scale: float = 2.0, seed: int = 0, check: bool = True,
                 raise_on_mismatch: bool = True):
        if not compressors:
            raise ValueError("ServingSimulator needs at least one compressor")
        names = [c.name for c in compressors]
        if len(set(names)) != len(names):
            raise ValueError(f"compressor names must be unique: {names}")
        if page_size & (page_size - 1) or any(page_size % c.compress_ratio for c in compressors):
            raise ValueError("page_size must be a power of two and a multiple of every ratio")
        self.device = torch.device(device)
        self.page_size, self.swa_page_size = page_size, swa_page_size
        self.max_requests, self.max_context = max_requests, max_context
        self.speculative, self.use_cuda_graph = speculative, use_cuda_graph
        self.lengths_on_device, self.out_loc_dtype = lengths_on_device, out_loc_dtype
        self.swa_window, self.score_scale = swa_window, score_scale
        self.check, self.raise_on_mismatch = check, raise_on_mismatch
        self.num_req_rows = max_requests + 1          # the last row is the padding dummy
        self.dummy_rid = max_requests
        pages_per_req = -(-max_context // page_size)
        swa_per_req = -(-max_context // swa_page_size)
        self.num_pages = num_pages or (max_requests * pages_per_req + 1) * 3 // 2
        self.num_swa_pages = num_swa_pages or (max_requests * swa_per_req + 1) * 3 // 2
        self._rng = random.Random(seed)
        self._gen = torch.Generator().manual_seed(seed)
        self.steps = 0

        # Token pool tables. req_to_token is a strided view (any row stride is allowed).
        wide = torch.zeros(self.num_req_rows, max_context + 5, dtype=torch.int32)
        self.req_to_token_host = wide[:, :max_context]
        self.full_to_state_host = torch.full((self.num_pages * page_size,), -1, dtype=torch.int64)
        if self.device.type == "cpu":
            self.req_to_token, self.full_to_state = self.req_to_token_host, self.full_to_state_host
        else:
            wide_dev = torch.zeros_like(wide, device=self.device)
            self.req_to_token = wide_dev[:, :max_context]
            self.full_to_state = self.full_to_state_host.to(self.device)
        self._free_pages = list(range(self.num_pages))
        self._free_swa = list(range(self.num_swa_pages))
        self._page_refs: Dict[int, int] = {}
        self._swa_refs: Dict[int, int] = {}
        self._free_rids = list(range(max_requests))
        self.requests: Dict[int, Request] = {}

        # RoPE table (complex [max_pos, 32]) shared by all compressors.
        self.freqs_cis = worlds.rope_table(max_context)
        self.freqs_cis_dev = self.freqs_cis.to(self.device)

        self.compressors = [_Compressor(c, self, self._gen) for c in compressors]
        online = [c for c in self.compressors if c.cfg.is_online]
        self._drafts = _OnlineDrafts(self, online) if speculative and online else None
        if swa_window is not None:
            rings = [c.ring for c in self.compressors if c.cfg.addressing == "swa_paged"]
            if swa_window < max(rings, default=0) + 8:
                raise ValueError("swa_window must keep at least ring_size + 8 tokens")
        # The dummy request that pads CUDA-graph decode batches owns one page of each pool.
        dummy = Request(self.dummy_rid, "<pad>")
        self._map_positions(dummy, 0, 1)
        self._dummy = dummy
        self._sync_tables()

    # ---------------------------------------------------------------- pools and requests ----
    def _take(self, free: List[int], refs: Dict[int, int], what: str) -> int:
        if not free:
            raise RuntimeError(f"simulator out of {what}")
        page = free.pop(self._rng.randrange(len(free)))
        refs[page] = 1
        return page

    def _release(self, page: int, free: List[int], refs: Dict[int, int]) -> bool:
        refs[page] -= 1
        if refs[page] == 0:
            del refs[page]
            free.append(page)
            return True
        return False

    def _map_positions(self, req: Request, start: int, end: int) -> None:
        """Allocate pages for positions [start, end) and fill req_to_token / full_to_state."""
        if end > self.max_context:
            raise ValueError(f"request {req.name}: length {end} > max_context {self.max_context}")
        ps, sps = self.page_size, self.swa_page_size
        for pos in range(start, end):
            if pos // ps not in req.full_pages:
                req.full_pages[pos // ps] = self._take(self._free_pages, self._page_refs, "pages")
            if pos // sps not in req.swa_pages:
                req.swa_pages[pos // sps] = self._take(self._free_swa, self._swa_refs, "SWA pages")
        if end <= start:
            return
        pos = torch.arange(start, end)
        full = torch.tensor([req.full_pages[p // ps] for p in range(start, end)]) * ps + pos % ps
        swa = torch.tensor([req.swa_pages[p // sps] for p in range(start, end)]) * sps + pos % sps
        self.req_to_token_host[req.rid, start:end] = full.to(torch.int32)
        self.full_to_state_host[full] = swa

    def _sync_tables(self) -> None:
        if self.device.type != "cpu":
            self.req_to_token.copy_(self.req_to_token_host)
            self.full_to_state.copy_(self.full_to_state_host)

    def add_request(self, name: Optional[str] = None, *, prefix_from: Optional[Request] = None,
                    prefix_len: int = 0) -> Request:
        """A new request. With `prefix_from`, it starts with the first `prefix_len` tokens of
        that request already cached (a prefix-cache hit sharing its full and SWA pages)."""
        if not self._free_rids:
            raise RuntimeError("simulator out of request rows")
        rid = self._free_rids.pop(self._rng.randrange(len(self._free_rids)))
        req = Request(rid, name or f"r{rid}")
        for comp in self.compressors:
            req.history[comp.cfg.name] = _Rows(comp.cfg.kv_score_row_width)
            req.reference_tokens[comp.cfg.name] = {}
        if prefix_from is not None and prefix_len:
            self._share_prefix(req, prefix_from, prefix_len)
        self.requests[rid] = req
        return req

    def _share_prefix(self, req: Request, parent: Request, n: int) -> None:
        if self.swa_window is not None:
            raise ValueError("prefix sharing is not simulated together with SWA eviction")
        if n % self.page_size or n % self.swa_page_size or n > parent.rollback_floor:
            raise ValueError("a shared prefix must be whole pages of both pools and committed")
        for comp in self.compressors:
            cfg = comp.cfg
            if cfg.compress_ratio == 4 and cfg.addressing != "swa_paged":
                raise ValueError(f"{cfg.name}: a cr=4 overlap window can only be shared through "
                                 "SWA pages (the request-ring state belongs to the parent)")
            if n % cfg.window:
                raise ValueError(f"{cfg.name}: a shared prefix must end on a window boundary")
        for i in range(n // self.page_size):
            req.full_pages[i] = parent.full_pages[i]
            self._page_refs[parent.full_pages[i]] += 1
        for i in range(n // self.swa_page_size):
            req.swa_pages[i] = parent.swa_pages[i]
            self._swa_refs[parent.swa_pages[i]] += 1
        self.req_to_token_host[req.rid, :n] = self.req_to_token_host[parent.rid, :n]
        for comp in self.compressors:
            name = comp.cfg.name
            req.history[name] = parent.history[name].prefix_copy(n)
            req.reference_tokens[name] = {k: v for k, v in parent.reference_tokens[name].items()
                                          if (k + 1) * comp.cfg.compress_ratio <= n}
        req.seq_len = req.rollback_floor = n
        self._sync_tables()

    def finish(self, req: Request) -> None:
        """Release the request's row and pages (shared pages stay with their other users)."""
        for page in req.full_pages.values():
            if self._release(page, self._free_pages, self._page_refs):
                locs = torch.arange(page * self.page_size, (page + 1) * self.page_size)
                self.full_to_state_host[locs] = -1
        for idx, page in req.swa_pages.items():
            if idx >= req.evicted_swa:
                self._release(page, self._free_swa, self._swa_refs)
        self.req_to_token_host[req.rid] = 0
        self._sync_tables()
        del self.requests[req.rid]
        self._free_rids.append(req.rid)
        req.finished = True

    def truncate(self, req: Request, length: int) -> None:
        """Speculative rollback: keep the first `length` tokens after a verify step of width
        <= the rings' pad, keeping at least the first verified token."""
        if not self.speculative:
            raise ValueError("truncate() needs a speculative simulator (rings with draft room)")
        bad = [c.cfg.name for c in self.compressors if c.cfg.addressing == "legacy"]
        if bad:
            raise ValueError(f"compressors {bad} keep no draft room and cannot roll back")
        if req.last_kind != "verify" and any(c.cfg.is_online for c in self.compressors):
            raise ValueError("an online compressor rolls back only after a \"verify\" step "
                             "(its staged banks)")
        pad = min(c.pad if not c.cfg.is_online else MAX_VERIFY for c in self.compressors)
        if req.last_width > pad:
            raise ValueError(f"verify width {req.last_width} exceeds the rings' pad {pad}")
        if not req.rollback_floor <= length <= req.seq_len:
            raise ValueError(f"truncate {req.name} to {length}: allowed "
                             f"[{req.rollback_floor}, {req.seq_len}]")
        req.seq_len = req.rollback_floor = length
        for comp in self.compressors:
            req.history[comp.cfg.name].truncate(length)
            cr = comp.cfg.compress_ratio
            memo = req.reference_tokens[comp.cfg.name]
            for k in [k for k in memo if (k + 1) * cr > length]:
                del memo[k]

    def _evict_swa(self, req: Request) -> None:
        """Free SWA pages that lie entirely before the sliding window."""
        sps = self.swa_page_size
        keep_from = (req.seq_len - self.swa_window) // sps
        for idx in range(req.evicted_swa, keep_from):
            full = self.req_to_token_host[req.rid, idx * sps:(idx + 1) * sps].to(torch.int64)
            self.full_to_state_host[full] = -1
            self._release(req.swa_pages[idx], self._free_swa, self._swa_refs)
        req.evicted_swa = max(req.evicted_swa, keep_from)

    # ----------------------------------------------------------------------- the step ----
    def _new_rows(self, comp: _Compressor, n: int) -> torch.Tensor:
        """n kv_score rows as the model's projection would give them (values as fed)."""
        cfg = comp.cfg
        rows = worlds.kv_score_rows(n, cfg.compress_ratio, cfg.head_dim, self._gen,
                                    self.score_scale)
        return rows.to(cfg.input_dtype).to(torch.float32)

    def _lengths(self, values: List[int]) -> torch.Tensor:
        t = torch.tensor(values, dtype=torch.int64)
        return t.to(self.device) if self.lengths_on_device else t

    def step(self, batch: Sequence[Tuple[Request, int]], kind: Optional[str] = None) -> StepResult:
        """Run one forward step. kind: "decode" (every n == 1), "extend" (any n >= 0; also
        "prefill"/"verify", which are extends); default: decode when every n == 1 and every
        request already has tokens, else extend."""
        entries = [(req, int(n)) for req, n in batch]
        if not entries:
            raise ValueError("empty batch")
        if len({id(r) for r, _ in entries}) != len(entries):
            raise ValueError("a request appears twice in the batch")
        for req, n in entries:
            if req.finished or n < 0:
                raise ValueError(f"bad batch entry ({req.name}, {n})")
        if kind is None:
            decode = all(n == 1 and r.seq_len > 0 for r, n in entries)
            kind = "decode" if decode else "extend"
        if kind not in ("decode", "extend", "prefill", "verify"):
            raise ValueError(f"unknown step kind {kind!r}")
        is_decode = kind == "decode"
        if is_decode and any(n != 1 for _, n in entries):
            raise ValueError("a decode step adds exactly one token per request")

        prefixes = [r.seq_len for r, _ in entries]
        widths = [n for _, n in entries]
        drafts = self._drafts.begin(entries, prefixes, kind) if self._drafts else None
        for (req, n), prefix in zip(entries, prefixes):
            self._map_positions(req, prefix, prefix + n)
            for comp in self.compressors:
                req.history[comp.cfg.name].append(self._new_rows(comp, n))
        self._sync_tables()

        if is_decode:
            run = self._decode_inputs(entries, prefixes)
        else:
            run = self._extend_inputs(entries, prefixes, widths)

        snapshots = None
        if self.check:
            snapshots = {c.cfg.name: (c.state.clone(), c.cache.clone()) for c in self.compressors}

        # ---- the engine's part: plan once per (ratio, addressing, ring), then every layer ----
        self._sync()
        t0 = time.perf_counter()
        if drafts:
            drafts.commit_and_mark(run)
        plans = {}
        outputs = {}
        for comp in self.compressors:
            cfg = comp.cfg
            if comp.plan_key not in plans:
                plans[comp.plan_key] = (drafts.make_plan(comp) if drafts and drafts.verify
                                        and cfg.is_online else run.make_plan(comp))
            plan = plans[comp.plan_key]
            inputs = run.inputs[cfg.name]
            # The compressed rows are kept for the checks (and StepResult.outputs).
            kv = torch.empty(plan[1].shape[0], cfg.head_dim, dtype=cfg.out_dtype or inputs.dtype,
                             device=self.device)
            compress_and_store(
                comp.state_view, inputs, comp.ape_dev, plan, head_dim=cfg.head_dim,
                compress_ratio=cfg.compress_ratio, is_online=cfg.is_online,
                norm_weight=comp.norm_weight_dev, norm_eps=cfg.norm_eps,
                freq_cis=self.freqs_cis_dev, out_loc=run.out_loc[cfg.compress_ratio],
                kvcache=comp.cache, page_size=comp.cache_page_size,
                use_fp4=cfg.store_format == "fp4_indexer", bf16_store=cfg.store_format == "bf16",
                out=kv)
            outputs[cfg.name] = kv
            if drafts and drafts.verify and cfg.is_online:
                drafts.stage(comp, run)
        self._sync()
        op_seconds = time.perf_counter() - t0

        # ---- bookkeeping ----
        for (req, n), prefix in zip(entries, prefixes):
            req.seq_len = prefix + n
            # Only a speculative engine rolls back, and never past the first verified token.
            req.rollback_floor = prefix + min(n, 1) if self.speculative else prefix + n
            req.last_width = n
            req.last_kind = kind

        # ---- checks against the reference ----
        t1 = time.perf_counter()
        failures: List[str] = []
        reports = {}
        events = {}
        for comp in self.compressors:
            cfg = comp.cfg
            evs = run.events[cfg.compress_ratio]
            events[cfg.name] = [(e.req.name, e.seq_len // cfg.compress_ratio - 1, e.row)
                                for e in evs]
            report = CompressorReport(cfg.name, compressed=len(evs))
            reports[cfg.name] = report
            if self.check:
                state_before, cache_before = snapshots[cfg.name]
                plan = plans[comp.plan_key]
                failures += _check_outputs(comp, outputs[cfg.name], evs, plan, report)
                failures += _check_cache(comp, outputs[cfg.name], evs, cache_before, report)
                failures += _check_state(self, comp, run, state_before, report, drafts)
        check_seconds = time.perf_counter() - t1

        if self.swa_window is not None:
            for req, _ in entries:
                self._evict_swa(req)
            self._sync_tables()
        self.steps += 1
        result = StepResult(self.steps - 1, "decode" if is_decode else "extend", len(entries),
                            sum(widths), outputs, events, reports, op_seconds, check_seconds,
                            failures)
        if failures and self.raise_on_mismatch:
            desc = ", ".join(f"{r.name}+{n}@{p}" for (r, n), p in zip(entries, prefixes))
            raise SimulationMismatch(f"step {result.index} ({kind}: {desc}):\n  "
                                     + "\n  ".join(failures[:40]))
        return result

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _full_loc(self, req: Request, pos: int) -> int:
        return int(self.req_to_token_host[req.rid, pos])

    def _out_loc(self, cr: int, locs_and_pos: List[Tuple[int, int]], pad_value: int, pad: int):
        vals = [loc // cr if (pos + 1) % cr == 0 else -1 for loc, pos in locs_and_pos]
        vals += [pad_value] * pad
        return torch.tensor(vals, dtype=self.out_loc_dtype, device=self.device)

    # -------- decode: one token per request, padded with dummies under CUDA graphs --------
    def _decode_inputs(self, entries, prefixes) -> "_StepInputs":
        run = _StepInputs(self, is_decode=True)
        real = [(req, prefix + 1) for (req, _), prefix in zip(entries, prefixes)]
        bs = len(real)
        padded = _graph_batch_size(bs) if self.use_cuda_graph else bs
        dummies = [(self._dummy, 1)] * (padded - bs)
        rows_by_entry = real + dummies
        run.rids = [r.rid for r, _ in rows_by_entry]
        run.seq_lens = [s for _, s in rows_by_entry]
        run.token_of_row = [(r, s - 1) for r, s in rows_by_entry]
        for comp in self.compressors:
            name = comp.cfg.name
            rows = [req.history[name].get(s - 1, s) for req, s in real]
            rows += [self._new_rows(comp, 1) for _ in dummies]
            run.host_rows[name] = torch.cat(rows)
            run.inputs[name] = run.host_rows[name].to(self.device, comp.cfg.input_dtype)
        locs = [(self._full_loc(r, s - 1), s - 1) for r, s in real]
        for cr in {c.cfg.compress_ratio for c in self.compressors}:
            run.out_loc[cr] = self._out_loc(cr, locs, -1, padded - bs)
            run.events[cr] = [_Event(r, s, b, b, self._full_loc(r, s - 1) // cr)
                              for b, (r, s) in enumerate(real) if s % cr == 0]
        return run

    # -------- extend: ragged rows of all requests, padded to num_q_tokens under graphs ------
    def _extend_inputs(self, entries, prefixes, widths) -> "_StepInputs":
        run = _StepInputs(self, is_decode=False)
        real_tokens = sum(widths)
        run.num_q_tokens = _graph_token_count(real_tokens) if self.use_cuda_graph else real_tokens
        run.rids = [r.rid for r, _ in entries]
        run.seq_lens = [p + n for p, n in zip(prefixes, widths)]
        run.extend_lens = widths
        run.token_of_row = [(r, p + j) for (r, n), p in zip(entries, prefixes) for j in range(n)]
        pad = run.num_q_tokens - real_tokens
        for comp in self.compressors:
            name = comp.cfg.name
            rows = [req.history[name].get(p, p + n) for (req, n), p in zip(entries, prefixes)]
            host = torch.cat(rows) if rows else torch.empty(0, comp.cfg.kv_score_row_width)
            run.host_rows[name] = host
            # Padding rows are NaN: no valid record may ever read them.
            nan = torch.full((pad, comp.cfg.kv_score_row_width), float("nan"))
            run.inputs[name] = torch.cat([host, nan]).to(self.device, comp.cfg.input_dtype)
        locs = [(self._full_loc(r, pos), pos) for r, pos in run.token_of_row]
        for cr in {c.cfg.compress_ratio for c in self.compressors}:
            # Padding rows get loc 0, a real cache slot: a kernel must never use them.
            run.out_loc[cr] = self._out_loc(cr, locs, 0, pad)
            # Valid plan_c records come batch-major, position-ascending (contract 3.3; online:
            # one per closed chunk, same order), so the k-th closing token is output row k.
            closing = [(ragged, r, pos) for ragged, (r, pos) in enumerate(run.token_of_row)
                       if (pos + 1) % cr == 0]
            run.events[cr] = [_Event(r, pos + 1, k, ragged, self._full_loc(r, pos) // cr)
                              for k, (ragged, r, pos) in enumerate(closing)]
        return run


def _graph_batch_size(bs: int) -> int:
    """The CUDA-graph decode bucket that holds `bs` entries: 1, 2, 4, 8, then multiples of 8."""
    for size in (1, 2, 4, 8):
        if bs <= size:
            return size
    return -(-bs // 8) * 8


def _graph_token_count(n: int) -> int:
    """A padded token count strictly larger than n (the captured graph's num_q_tokens)."""
    return (n // 64 + 1) * 64


class _StepInputs:
    """Everything one step hands to the ops, plus what the checker needs to know."""

    def __init__(self, sim: ServingSimulator, is_decode: bool):
        self.sim = sim
        self.is_decode = is_decode
        self.rids: List[int] = []
        self.seq_lens: List[int] = []
        self.extend_lens: List[int] = []
        self.num_q_tokens = 0
        self.token_of_row: List[Tuple[Request, int]] = []  # input row -> (request, position)
        self.host_rows: Dict[str, torch.Tensor] = {}        # real input rows (float32, host)
        self.inputs: Dict[str, torch.Tensor] = {}           # device input (dtype, padded)
        self.out_loc: Dict[int, torch.Tensor] = {}
        self.events: Dict[int, List[_Event]] = {}

    def make_plan(self, comp: _Compressor):
        sim, cfg = self.sim, comp.cfg
        cr = cfg.compress_ratio
        rpi = torch.tensor(self.rids, dtype=torch.int64, device=sim.device)
        seq_lens = sim._lengths(self.seq_lens)
        use_req_ring = cfg.addressing == "req_ring"
        if self.is_decode:
            if cfg.addressing == "online":
                return CompressorDecodePlan.generate_online(seq_lens, rpi, sim.req_to_token)
            if cfg.addressing == "legacy":
                return CompressorDecodePlan.generate_legacy(cr, rpi, seq_lens)
            return CompressorDecodePlan.generate(
                cr, rpi, sim.req_to_token, sim.full_to_state, seq_lens, sim.swa_page_size,
                comp.ring, use_req_ring=use_req_ring)
        extend_lens = sim._lengths(self.extend_lens)
        graph = sim.use_cuda_graph
        if cfg.addressing == "online":
            return CompressorPrefillPlan.generate_online(
                seq_lens, extend_lens, rpi, sim.req_to_token, self.num_q_tokens,
                use_cuda_graph=graph)
        if cfg.addressing == "legacy":
            return CompressorPrefillPlan.generate_legacy(
                cr, rpi, seq_lens, extend_lens, self.num_q_tokens, sim.device, use_cuda_graph=graph)
        return CompressorPrefillPlan.generate(
            cr, rpi, seq_lens, extend_lens, sim.req_to_token, sim.full_to_state,
            sim.swa_page_size, comp.ring, self.num_q_tokens, use_cuda_graph=graph,
            use_req_ring=use_req_ring)


class _OnlineDrafts:
    """The engine's part of contract 10 for the online compressors of a speculative simulator:
    the pending lengths (one tensor for every online layer, as an engine's pool holds them), the
    commit at the start of the step after a verify, the mark, the online verify plan (bank
    stride as state_slot_offset) and the staging after compress_forward; and the state rows the
    checker expects from them."""

    def __init__(self, sim: ServingSimulator, comps: List[_Compressor]):
        self.sim, self.comps = sim, comps
        self.pending = torch.full((sim.num_req_rows,), -1, dtype=torch.int64, device=sim.device)
        self.pending_host: Dict[int, int] = {}  # rid -> committed length at the last verify
        self.last_d = 0                         # width of that verify (0: nothing pending)
        self.verify, self.d = False, 0

    def begin(self, entries, prefixes, kind: str) -> "_OnlineDrafts":
        self.entries, self.prefixes = entries, prefixes
        self.verify = kind == "verify"
        if self.verify:
            widths = {n for _, n in entries}
            d = widths.pop() if len(widths) == 1 else 0
            if not 1 <= d <= MAX_VERIFY:
                raise ValueError(f"a verify step with an online compressor needs one width in "
                                 f"[1, {MAX_VERIFY}] for every request, got "
                                 f"{sorted(n for _, n in entries)}")
            self.d = d
        in_batch = {r.rid for r, _ in entries}
        lost = [rid for rid in self.pending_host
                if rid not in in_batch and rid in self.sim.requests]
        if self.last_d and lost:
            raise ValueError(f"the step after a verify must carry every verified request (its "
                             f"accepted state is committed then, contract 10.4); missing rows "
                             f"{lost}")
        # The commits the step makes: rid -> (request, committed length).
        self.committed: Dict[int, Tuple[Request, int]] = {}
        if self.last_d:
            for (req, _), p in zip(entries, prefixes):
                old = self.pending_host.get(req.rid)
                acc = 0 if old is None else max(0, min(p - old, self.last_d))
                if acc > 0 and (old + acc) % 128:
                    self.committed[req.rid] = (req, p)
        return self

    def commit_and_mark(self, run: "_StepInputs") -> None:
        sim = self.sim
        dev = sim.device
        self.rids = torch.tensor([r.rid for r, _ in self.entries], dtype=torch.int64, device=dev)
        self.seq = torch.tensor(self.prefixes, dtype=torch.int64, device=dev)
        B = len(self.entries)
        if self.last_d:
            for comp in self.comps:
                _spec.online_c128_mtp_commit_pending(
                    self.seq, self.rids, sim.req_to_token, self.pending, comp.state, B,
                    self.last_d, comp.bank_stride, sim.num_req_rows, head_dim=comp.cfg.head_dim)
            self.last_d, self.pending_host = 0, {}
        if self.verify:
            comp = self.comps[0]
            _spec.online_c128_mtp_mark_pending(self.seq, self.rids, self.pending, B,
                                               sim.num_req_rows, head_dim=comp.cfg.head_dim,
                                               state_dtype=comp.cfg.state_dtype)
            self.pending_host = {r.rid: p for (r, _), p in zip(self.entries, self.prefixes)}
            self.last_d = self.d

    def make_plan(self, comp: _Compressor):
        return CompressorPrefillPlan.generate_online_verify(
            self.seq, self.d, self.rids, self.sim.req_to_token,
            use_cuda_graph=self.sim.use_cuda_graph, state_slot_offset=comp.bank_stride)

    def stage(self, comp: _Compressor, run: "_StepInputs") -> None:
        _spec.online_c128_mtp_write_prefix_states(
            run.inputs[comp.cfg.name], self.seq, self.rids, self.sim.req_to_token, comp.ape_dev,
            comp.state, len(self.entries), self.d, comp.bank_stride, head_dim=comp.cfg.head_dim)

    def expected_writes(self, comp: _Compressor, run: "_StepInputs"):
        """{slot: (request, seq_len, row)} as _expected_state_writes: the commits, then (a
        verify) compress_forward's trailing segment in bank 1 and each token's staged bank."""
        writes = {rid: (req, p, 0) for rid, (req, p) in self.committed.items()}
        if not self.verify:
            writes.update(_expected_state_writes(self.sim, comp, run))
            return writes
        stride, row = comp.bank_stride, 0
        for (req, d), p in zip(self.entries, self.prefixes):
            if (p + d) % 128:
                writes[req.rid + stride] = (req, p + d, row + d - 1)
            for i in range(d):
                if (p + i + 1) % 128:
                    writes[req.rid + (i + 1) * stride] = (req, p + i + 1, row + i)
            row += d
        return writes


# ------------------------------------------------------------------------------------------
# Checks
# ------------------------------------------------------------------------------------------
BF16_UNIT = 2.0 ** -8      # unit roundoff of bf16 (8 significant bits)
FP32_TOL = 1e-5            # |out - ref| <= FP32_TOL * (1 + |ref|) when nothing is bf16


def _allowed_error(cfg: CompressorConfig, req: Request, k: int, ape: torch.Tensor,
                   ref: torch.Tensor) -> torch.Tensor:
    """Per-channel bound on |out - ref| for compressed token k of `req` ([hd] float64).

    fp32 input, state and output: FP32_TOL relative/absolute. bf16 adds (twice) its
    first-order effect: a bf16 output is rounded once (u |out|); a bf16 state holding fp32
    input rows rounds the rows the kernel reloads, which moves the pooled value by at most
    u * sum_i w_i (|kv_i| + |score_i| |kv_i - out|) (the score error goes through exp()).
    bf16 input rows are exact in both the kernel and the reference. The online bf16 state
    re-rounds its running max, sum and kv at every token of the chunk; that accumulation has
    no useful first-order bound, so it gets a loose 2^-3 (it still catches wrong rows)."""
    allowed = FP32_TOL * (1.0 + ref.abs())
    out_dtype = cfg.out_dtype or cfg.input_dtype
    if cfg.is_online and cfg.state_dtype == torch.bfloat16:
        return allowed + 2.0 ** -3 * (1.0 + ref.abs())
    if out_dtype == torch.bfloat16:
        allowed = allowed + 2 * BF16_UNIT * ref.abs()
    if cfg.state_dtype == torch.bfloat16 and cfg.input_dtype != torch.bfloat16:
        kv, score, ape_rows = _window(cfg, req, k, ape)
        w = torch.softmax(score + ape_rows, dim=0)
        spread = kv.abs() + score.abs() * (kv - ref).abs()
        allowed = allowed + 2 * BF16_UNIT * (w * spread).sum(dim=0)
    return allowed


def _window(cfg: CompressorConfig, req: Request, k: int, ape: torch.Tensor):
    """(kv, score, ape) rows [rows, hd] float64 of the window of compressed token k (contract 1.2;
    the absent rows of the first cr = 4 window are left out)."""
    hd, cr = cfg.head_dim, cfg.compress_ratio
    a = ape.to(torch.float64).reshape(cfg.window, hd)
    hist = req.history[cfg.name]
    if cr == 128:
        rows = hist.get(128 * k, 128 * (k + 1)).to(torch.float64)
        return rows[:, :hd], rows[:, hd:], a
    cur = hist.get(4 * k, 4 * k + 4).to(torch.float64)
    kv, score, a_rows = cur[:, hd:2 * hd], cur[:, 3 * hd:], a[4:]
    if k > 0:
        prev = hist.get(4 * k - 4, 4 * k).to(torch.float64)
        kv = torch.cat([prev[:, :hd], kv])
        score = torch.cat([prev[:, 2 * hd:3 * hd], score])
        a_rows = a
    return kv, score, a_rows


def reference_tokens(comp_cfg: CompressorConfig, req: Request, ape: torch.Tensor,
                     ks: Sequence[int]) -> torch.Tensor:
    """reference.compressed_tokens of request `req`, tokens `ks` ([len(ks), hd] float64).

    Evaluated over the request's history sliced to the windows involved (a slice that starts
    one window early for cr = 4 so the overlap rows are there), which is exact: a token only
    sees its own window. Results are memoised per request until truncate() drops them."""
    cr, hd = comp_cfg.compress_ratio, comp_cfg.head_dim
    memo = req.reference_tokens[comp_cfg.name]
    missing = sorted({k for k in ks if k not in memo})
    if missing:
        lo, hi = missing[0], missing[-1]
        start = max(lo - 1, 0) * cr if cr == 4 else lo * cr
        rows = req.history[comp_cfg.name].get(start, (hi + 1) * cr)
        toks = reference.compressed_tokens(rows, ape, cr, hd)
        for k in missing:
            memo[k] = toks[k - start // cr]
    if not ks:
        return torch.empty(0, hd, dtype=torch.float64)
    return torch.stack([memo[k] for k in ks])


def _plan_fields(plan, row: int) -> str:
    """The four 32-bit words of a plan row, for failure messages."""
    if row >= plan[1].shape[0]:
        return f"plan has no row {row}"
    words = plan[1][row].cpu().contiguous().view(torch.int32).tolist()
    if plan.is_decode:
        return "plan row {}: seq_len={} write_loc={} pages=({}, {})".format(row, *words)
    return (f"plan row {row}: seq_len={words[0] & 0xFFFFFFFF} ragged_id={words[1] & 0xFFFF} "
            f"buffer_len={(words[1] >> 16) & 0xFFFF} pages=({words[2]}, {words[3]})")


def _check_outputs(comp: _Compressor, out: torch.Tensor, events: List[_Event], plan,
                   report: CompressorReport) -> List[str]:
    cfg = comp.cfg
    name = cfg.name
    fails = []
    if out.shape[1] != cfg.head_dim or out.shape[0] < len(events):
        return [f"{name}: compress_forward output {tuple(out.shape)} but {len(events)} windows "
                f"closed (plan rows {plan[1].shape[0]})"]
    got = out.detach().to("cpu", torch.float64)
    is_event = torch.zeros(got.shape[0], dtype=torch.bool)
    if events:
        rows = torch.tensor([e.row for e in events])
        is_event[rows] = True
        ref = _grouped_reference(comp, events)
        err = (got[rows] - ref).abs()
        err = torch.nan_to_num(err, nan=float("inf"))
        report.max_abs_err = float(err.max())
        allowed = torch.stack([_allowed_error(cfg, e.req, e.seq_len // cfg.compress_ratio - 1,
                                              comp.ape, r) for e, r in zip(events, ref)])
        bad = (err > allowed).any(dim=1).nonzero().flatten().tolist()
        for i in bad[:4]:
            e = events[i]
            c = int((err[i] - allowed[i]).argmax())
            fails.append(f"{name}: compressed token {e.seq_len // cfg.compress_ratio - 1} of "
                         f"{e.req.name} (seq_len {e.seq_len}, out row {e.row}): channel {c} "
                         f"|err| {float(err[i, c]):.3g} > allowed {float(allowed[i, c]):.3g} "
                         f"(ref {float(ref[i, c]):.4g}); {_plan_fields(plan, e.row)}")
        if len(bad) > 4:
            fails.append(f"{name}: ... {len(bad)} compressed tokens off in total")
    stray = (got[~is_event] != 0).any(dim=1)
    if bool(stray.any()):
        idx = (~is_event).nonzero().flatten()[stray].tolist()
        fails.append(f"{name}: output rows {idx[:8]} close no window but are not zero")
    return fails


def _grouped_reference(comp: _Compressor, events: List[_Event]) -> torch.Tensor:
    """Reference tokens for many events, one reference call per request."""
    cr = comp.cfg.compress_ratio
    by_req: Dict[int, List[int]] = {}
    for e in events:
        by_req.setdefault(id(e.req), []).append(e.seq_len // cr - 1)
    reqs = {id(e.req): e.req for e in events}
    for key, ks in by_req.items():
        reference_tokens(comp.cfg, reqs[key], comp.ape, ks)
    return torch.stack([e.req.reference_tokens[comp.cfg.name][e.seq_len // cr - 1] for e in events])


# ---- cache bytes ----
def _ordinal(codes: torch.Tensor, sign_bit: int) -> torch.Tensor:
    """Sign-magnitude codes -> integers in value order (+0 and -0 both 0)."""
    c = codes.to(torch.int64)
    mag = c & (sign_bit - 1)
    return torch.where((c & sign_bit) != 0, -mag, mag)


def _compare_codes(got: torch.Tensor, want: torch.Tensor, sign_bit: int, what: str,
                   slack: int, fails: List[str]) -> int:
    """Codes must be equal, except at most `slack` of them exactly one step apart."""
    diff = (_ordinal(got, sign_bit) - _ordinal(want, sign_bit)).abs()
    far = int((diff > 1).sum())
    near = int((diff == 1).sum())
    if far:
        fails.append(f"{what}: {far} codes more than one step from the shadow")
    if near > slack:
        fails.append(f"{what}: {near} codes one step off (> slack {slack} of {got.numel()})")
    return near


def _compare_bf16(got: torch.Tensor, want: torch.Tensor, what: str, slack: Optional[int],
                  fails: List[str]) -> int:
    """bf16 values (uint8 [tokens, 2 * n]) at most 1 ulp apart (at most `slack` of them when
    given). A value that cancels to near zero (RoPE's re*cos - im*sin) carries the absolute
    fp32 error of its terms, many bf16 ulps of a tiny result: differences within 2^-20 of the
    token's largest value count as 1 ulp."""
    g_bits = got.contiguous().view(torch.int16).to(torch.int64) & 0xFFFF
    w_bits = want.contiguous().view(torch.int16).to(torch.int64) & 0xFFFF
    ulps = (_ordinal(g_bits, 0x8000) - _ordinal(w_bits, 0x8000)).abs()
    g_val = got.contiguous().view(torch.bfloat16).double()
    w_val = want.contiguous().view(torch.bfloat16).double()
    atol = 2.0 ** -20 * w_val.abs().amax(dim=1, keepdim=True)
    close = ((g_val - w_val).abs() <= atol) & (ulps > 0)
    far = int(((ulps > 1) & ~close).sum())
    near = int(((ulps == 1) | close).sum())
    if far:
        fails.append(f"{what}: {far} bf16 values more than 1 ulp from the shadow")
    if slack is not None and near > slack:
        fails.append(f"{what}: {near} bf16 values 1 ulp off (> slack {slack} of {g_bits.numel()})")
    return near


def _slack(n_codes: int) -> int:
    """contract 4: at most 0.5 % of the codes may be one step off (rounded up)."""
    return math.ceil(0.005 * n_codes)


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def _check_cache(comp: _Compressor, kv: torch.Tensor, events: List[_Event],
                 before: torch.Tensor, report: CompressorReport) -> List[str]:
    cfg = comp.cfg
    fmt, ps = cfg.store_format, comp.cache_page_size
    name = f"{cfg.name} cache ({fmt})"
    _, data_bytes, scale_bytes, scale_stride = STORE_FORMATS[fmt]
    cache = comp.cache.cpu()
    before = before.cpu()
    written = [e for e in events if e.loc >= 0]
    fails = []
    # Shadow: the cache before the step plus reference.store of this step's compressed tokens
    # (the kernel's compress output, already checked against the reference above).
    shadow = before.clone()
    if written:
        rows = torch.tensor([e.row for e in written])
        positions = torch.tensor([e.seq_len - cfg.compress_ratio for e in written])
        locs = torch.tensor([e.loc for e in written])
        reference.store(shadow, kv.detach().cpu()[rows].float(), positions, locs,
                        comp.norm_weight, cfg.norm_eps, comp.freqs_cis, fmt, ps)
    # Byte map of the windows written: data and scale bytes (fp8_ds_mla scale byte 7 is
    # unused and left out of every comparison).
    region = torch.zeros_like(cache, dtype=torch.bool)
    ignored = torch.zeros_like(region)
    data_cols, scale_cols, pages = [], [], []
    for e in written:
        page, off = divmod(e.loc, ps)
        dc = torch.arange(off * data_bytes, (off + 1) * data_bytes)
        sc = ps * data_bytes + off * scale_stride + torch.arange(scale_bytes)
        region[page, dc] = True
        region[page, sc] = True
        if scale_stride > scale_bytes:
            ignored[page, ps * data_bytes + off * scale_stride + scale_bytes:
                    ps * data_bytes + (off + 1) * scale_stride] = True
        pages.append(page)
        data_cols.append(dc)
        scale_cols.append(sc)
    outside = ~(region | ignored)
    changed = (cache != before) & outside
    if bool(changed.any()):
        where = changed.nonzero()[:4].tolist()
        fails.append(f"{name}: {int(changed.sum())} bytes changed outside the windows written "
                     f"this step (page, byte) {where}")
    report.cache_bytes_checked = int(region.sum())
    if not written:
        return fails
    pg = torch.tensor(pages)[:, None]
    got_d, want_d = cache[pg, torch.stack(data_cols)], shadow[pg, torch.stack(data_cols)]
    if scale_bytes:
        got_s, want_s = cache[pg, torch.stack(scale_cols)], shadow[pg, torch.stack(scale_cols)]
    near = 0
    if fmt == "fp8_ds_mla":
        codes = got_d[:, :448]
        near += _compare_codes(codes, want_d[:, :448], 0x80, f"{name} e4m3",
                               _slack(codes.numel()), fails)
        near += _compare_bf16(got_d[:, 448:], want_d[:, 448:], f"{name} rope", None, fails)
        if not torch.equal(got_s, want_s):
            fails.append(f"{name}: {int((got_s != want_s).sum())} UE8M0 scale bytes differ")
    elif fmt == "bf16":
        near += _compare_bf16(got_d, want_d, f"{name} bf16", _slack(got_d.numel() // 2), fails)
    elif fmt == "fp8_indexer":
        near += _compare_codes(got_d, want_d, 0x80, f"{name} e4m3", _slack(got_d.numel()), fails)
        gs = got_s.contiguous().view(torch.float32).double()
        ws = want_s.contiguous().view(torch.float32).double()
        rel = ((gs - ws).abs() / ws.abs()).nan_to_num(nan=float("inf"))
        if bool((rel > 1e-5).any()):
            fails.append(f"{name}: fp32 scales off by up to {float(rel.max()):.3g} relative")
    elif fmt == "fp4_indexer":
        g4, w4 = _nibbles(got_d), _nibbles(want_d)
        near += _compare_codes(g4, w4, 0x8, f"{name} e2m1", _slack(g4.numel()), fails)
        if not torch.equal(got_s, want_s):
            fails.append(f"{name}: {int((got_s != want_s).sum())} UE8M0 scale bytes differ")
    report.code_slack = near
    return fails


# ---- state rows ----
def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)


def _expected_state_writes(sim: ServingSimulator, comp: _Compressor, run: _StepInputs):
    """{slot: input row} (offline) or {slot: (request-like, seq_len, input row)} (online) the
    step must persist, from the contract's rules (independent of the plan)."""
    cfg = comp.cfg
    cr = cfg.compress_ratio
    writes = {}
    if run.is_decode:
        for row, (req, pos) in enumerate(run.token_of_row):
            if cfg.is_online:
                if pos % 128 != 127:
                    writes[req.rid] = (req, pos + 1, row)
            else:
                writes[comp.slot(sim, req.rid, pos)] = row
        return writes
    row = 0
    for rid, sl, el in zip(run.rids, run.seq_lens, run.extend_lens):
        req = sim.requests[rid]
        prefix = sl - el
        if cfg.is_online:
            if el and sl % 128:
                writes[rid] = (req, sl, row + el - 1)
            row += el
            continue
        last_c = sl // cr * cr
        first_w = min(last_c - (4 if cr == 4 else 0), sl - comp.pad)
        for pos in range(prefix, sl):
            sps = sim.swa_page_size
            band = cfg.addressing == "swa_paged" and pos % sps >= sps - 4
            if pos >= first_w or band:
                writes[comp.slot(sim, rid, pos)] = row + pos - prefix
        row += el
    return writes


def _check_state(sim: ServingSimulator, comp: _Compressor, run: _StepInputs,
                 before: torch.Tensor, report: CompressorReport,
                 drafts: Optional["_OnlineDrafts"] = None) -> List[str]:
    cfg = comp.cfg
    name = f"{cfg.name} state"
    after = comp.state.detach().cpu()
    before = before.cpu()
    if drafts and cfg.is_online:
        writes = drafts.expected_writes(comp, run)
    else:
        writes = _expected_state_writes(sim, comp, run)
    report.state_rows_checked = len(writes)
    fails = []
    changed = (_bits(after) != _bits(before)).any(dim=1).nonzero().flatten().tolist()
    stray = [s for s in changed if s not in writes]
    if stray:
        fails.append(f"{name}: rows {stray[:8]} changed but the step persists nothing there")
    if not writes:
        return fails
    slots = torch.tensor(list(writes.keys()))
    if bool((slots < 0).any()) or bool((slots >= after.shape[0]).any()):
        return fails + [f"{name}: expected slots out of range {slots.tolist()[:8]}"]
    if not cfg.is_online:
        rows = torch.tensor(list(writes.values()))
        want = run.host_rows[cfg.name][rows].to(cfg.input_dtype).to(cfg.state_dtype)
        bad = (_bits(after[slots]) != _bits(want)).any(dim=1).nonzero().flatten().tolist()
        for i in bad[:4]:
            req, pos = run.token_of_row[int(rows[i])]
            fails.append(f"{name}: slot {int(slots[i])} should hold the row of {req.name} "
                         f"position {pos}")
        return fails
    # Online: the running (max, sum, normalised kv) of the open chunk, per contract 3.5. fp32:
    # max to fp32 rounding, sum and kv within contract 4's 1e-4; bf16: max to one rounding, sum
    # and kv loosely (see _allowed_error).
    hd = cfg.head_dim
    fp32 = cfg.state_dtype == torch.float32
    tols = {"max": 1e-6 if fp32 else 2 * BF16_UNIT, "sum": 1e-4 if fp32 else 2.0 ** -3}
    tols["kv"] = tols["sum"]
    for slot, (req, seq_len, row) in writes.items():
        if req is sim._dummy:
            hist = run.host_rows[cfg.name][row:row + 1]
        else:
            hist = req.history[cfg.name].get((seq_len - 1) // 128 * 128, seq_len)
        m, s, k = reference.online_state(hist, comp.ape, hd)
        got = after[slot].double()
        parts = (("max", m, got[:hd]), ("sum", s, got[hd:2 * hd]), ("kv", k, got[2 * hd:]))
        for part, ref, g in parts:
            ptol = tols[part]
            scaled = ((g - ref).abs() / (1.0 + ref.abs())).nan_to_num(nan=float("inf"))
            if bool((scaled > ptol).any()):
                fails.append(f"{name}: slot {slot} ({req.name} after {seq_len} tokens) running "
                             f"{part} off by {float(scaled.max()):.3g} (> {ptol:.3g})")
    return fails
