"""A small speculative engine for one compressor (tests/test_spec.py): the same requests decoded
token by token, or verified D tokens at a time with a random accepted prefix, so that the two
runs' compressed rows, cache bytes and state rows can be compared.

Every request's real kv_score rows are fixed up front (`rows[b][pos]`); a verify step feeds the
real rows up to its accepted prefix and NaN rows after it (a rejected draft), so a rejected
row that any later step read would show as NaN. Compressed token k of request b is stored at
cache location `b * K + k`; a window closed by a rejected token goes to a scratch location (the
engine frees a rejected token's cache slot).
"""
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

import dsv4_ops
from dsv4_ops import spec
from dsv4_ops.layout import Compressor
from dsv4_ops.plans import CompressorDecodePlan, CompressorPrefillPlan
from dsv4_ops.testing import reference, worlds

SWA_PAGE = 64
MAX_CTX = 640


@dataclass(frozen=True)
class Case:
    compress_ratio: int
    head_dim: int
    addressing: str           # swa_paged | req_ring | legacy | online
    ring_size: Optional[int]  # None: the window (legacy, online)
    dtype: torch.dtype = torch.float32  # input and state dtype

    @property
    def window(self) -> int:
        return 8 if self.compress_ratio == 4 else 128

    @property
    def online(self) -> bool:
        return self.addressing == "online"

    @property
    def store_format(self) -> str:
        return "fp8_ds_mla" if self.head_dim == 512 else "fp8_indexer"

    def max_verify(self) -> int:
        if self.online:
            return spec.ONLINE_TOKEN_FOLD_MAX
        return spec.max_verify_tokens(self.compress_ratio, self.ring_size or self.window)

    def __str__(self) -> str:
        return (f"c{self.compress_ratio}-{self.addressing}-r{self.ring_size}-hd{self.head_dim}-"
                f"{str(self.dtype).split('.')[-1]}")


class Engine:
    """One compressor's state, cache and tables for `batch` requests (request rows 0..B-1)."""

    def __init__(self, case: Case, rows: List[torch.Tensor], device, max_verify: int = 8,
                 seed: int = 0):
        self.case, self.device, self.rows = case, torch.device(device), rows
        cr, hd, B = case.compress_ratio, case.head_dim, len(rows)
        self.B = B
        gen = torch.Generator().manual_seed(seed)
        # Tables: full loc = b * MAX_CTX + pos; SWA pages scattered, page-aligned.
        self.req_to_token = (torch.arange(B + 1, dtype=torch.int32)[:, None] * MAX_CTX
                             + torch.arange(MAX_CTX, dtype=torch.int32)).to(self.device)
        pages = (B + 1) * MAX_CTX // SWA_PAGE
        perm = torch.randperm(pages, generator=gen)
        loc = torch.arange((B + 1) * MAX_CTX)
        self.full_to_state = (perm[loc // SWA_PAGE] * SWA_PAGE + loc % SWA_PAGE).to(self.device)
        self.comp = Compressor(cr, hd, case.store_format, case.addressing,
                               ring_size=case.ring_size, state_dtype=case.dtype)
        if case.online:
            self.stride = B + 1  # bank stride: slots rid, rid + stride, ..., rid + D * stride
            slots = self.stride * (max_verify + 1)
            self.state = dsv4_ops.state_buffer(cr, hd, slots, is_online=True, dtype=case.dtype,
                                               device=self.device)
            self.pending = torch.full((B + 1,), -1, dtype=torch.int64, device=self.device)
        else:
            self.state = self.comp.state_buffer(num_requests=B + 1, num_swa_pages=pages,
                                                device=self.device)
        # NaN everywhere first: a row read before anything wrote it poisons its window.
        self.state.fill_(float("nan"))
        self.view = (self.state.view(-1, 1, 3 * hd) if case.online
                     else self.state.view(-1, cr, self.state.shape[-1]))
        ape, self.norm_weight = worlds.compressor_weights(self.comp, gen, norm_spread=0.2)
        self.ape = ape.to(self.device)
        self.norm_weight = self.norm_weight.to(self.device)
        self.freqs = worlds.rope_table(MAX_CTX).to(self.device)
        self.K = MAX_CTX // cr
        self.page_size = 16
        live_pages = -(-B * self.K // self.page_size)
        self.scratch = live_pages * self.page_size  # rejected windows: pages after the live ones
        n_pages = 2 * live_pages
        self.cache = torch.zeros(n_pages, self.comp.cache_page_bytes(self.page_size),
                                 dtype=torch.uint8, device=self.device)
        self.rid_all = self._rid(list(range(B)))
        self.lens = [0] * B
        self.outputs: Dict[Tuple[int, int], torch.Tensor] = {}

    # ---- helpers ------------------------------------------------------------------------------
    def _rid(self, rids) -> torch.Tensor:
        return torch.tensor(rids, dtype=torch.int64, device=self.device)

    def _store(self, kv, plan, out_loc: List[int]) -> None:
        loc = torch.tensor(out_loc, dtype=torch.int64, device=self.device)
        dsv4_ops.compress_norm_rope_store(
            kv, plan, norm_weight=self.norm_weight, norm_eps=1e-6, freq_cis=self.freqs,
            out_loc=loc, kvcache=self.cache, page_size=self.page_size)

    def _forward(self, x, plan) -> torch.Tensor:
        c = self.case
        return dsv4_ops.compress_forward(self.view, x, self.ape, plan, head_dim=c.head_dim,
                                         compress_ratio=c.compress_ratio, is_online=c.online)

    def _loc(self, b: int, pos: int, real: bool) -> int:
        """Cache location of the window closed by (b, pos), -1 if it closes none."""
        cr = self.case.compress_ratio
        if (pos + 1) % cr:
            return -1
        k = (pos + 1) // cr - 1
        return b * self.K + k if real else self.scratch + b * self.K + k

    def _record(self, kv, rows: List[Tuple[int, int, int]]) -> None:
        """rows: (output row, b, pos) of the windows real tokens closed."""
        cr = self.case.compress_ratio
        for r, b, pos in rows:
            self.outputs[(b, (pos + 1) // cr - 1)] = kv[r].clone()

    # ---- steps --------------------------------------------------------------------------------
    def prefill(self, lens: List[int]) -> None:
        c, B = self.case, self.B
        rids = list(range(B))
        x = torch.cat([self.rows[b][:lens[b]] for b in rids]).to(self.device, c.dtype)
        seq = torch.tensor(lens, dtype=torch.int64)
        ext = seq.clone()
        nq = int(sum(lens))
        rid = self._rid(rids)
        if c.online:
            plan = CompressorPrefillPlan.generate_online(seq, ext, rid, self.req_to_token, nq)
        elif c.addressing == "legacy":
            plan = CompressorPrefillPlan.generate_legacy(c.compress_ratio, rid, seq, ext, nq,
                                                         self.device)
        else:
            plan = CompressorPrefillPlan.generate(
                c.compress_ratio, rid, seq, ext, self.req_to_token, self.full_to_state,
                SWA_PAGE, c.ring_size, nq, use_req_ring=c.addressing == "req_ring")
        kv = self._forward(x, plan)
        ragged = [(b, p) for b in rids for p in range(lens[b])]
        self._store(kv, plan, [self._loc(b, p, True) for b, p in ragged])
        # plan_c rows: the closing tokens, batch-major, position-ascending.
        closing = [(b, p) for b, p in ragged if (p + 1) % c.compress_ratio == 0]
        self._record(kv, [(i, b, p) for i, (b, p) in enumerate(closing)])
        self.lens = list(lens)

    def decode(self, rids: List[int]) -> None:
        c = self.case
        pos = [self.lens[b] for b in rids]
        x = torch.stack([self.rows[b][p] for b, p in zip(rids, pos)]).to(self.device, c.dtype)
        seq = torch.tensor([p + 1 for p in pos], dtype=torch.int64, device=self.device)
        rid = self._rid(rids)
        if c.online:
            plan = CompressorDecodePlan.generate_online(seq, rid, self.req_to_token)
        elif c.addressing == "legacy":
            plan = CompressorDecodePlan.generate_legacy(c.compress_ratio, rid, seq)
        else:
            plan = CompressorDecodePlan.generate(
                c.compress_ratio, rid, self.req_to_token, self.full_to_state, seq, SWA_PAGE,
                c.ring_size, use_req_ring=c.addressing == "req_ring")
        kv = self._forward(x, plan)
        self._store(kv, plan, [self._loc(b, p, True) for b, p in zip(rids, pos)])
        self._record(kv, [(i, b, p) for i, (b, p) in enumerate(zip(rids, pos))
                          if (p + 1) % c.compress_ratio == 0])
        for b in rids:
            self.lens[b] += 1

    def verify_inputs(self, D: int, accepts: List[int]) -> Tuple[torch.Tensor, List[int]]:
        """kv_score rows [B*D, row] (real up to each accepted prefix, NaN after) and out_loc."""
        c, B = self.case, self.B
        width = self.rows[0].shape[1]
        x = torch.full((B * D, width), float("nan"))
        locs = []
        for b in range(B):
            for i in range(D):
                p = self.lens[b] + i
                if i < accepts[b]:
                    x[b * D + i] = self.rows[b][p]
                locs.append(self._loc(b, p, i < accepts[b]))
        return x.to(self.device, c.dtype), locs

    def verify_step(self, seq: torch.Tensor, x: torch.Tensor, out_loc: torch.Tensor, D: int):
        """One verify step on device tensors only (capturable): seq = committed lengths."""
        c, B = self.case, self.B
        rid = self.rid_all
        if c.online:
            spec.online_c128_mtp_commit_pending(seq, rid, self.req_to_token, self.pending,
                                                self.state, B, self.last_d, self.stride, B + 1,
                                                head_dim=c.head_dim)
            spec.online_c128_mtp_mark_pending(seq, rid, self.pending, B, B + 1,
                                              head_dim=c.head_dim, state_dtype=c.dtype)
            plan = CompressorPrefillPlan.generate_online_verify(
                seq, D, rid, self.req_to_token, state_slot_offset=self.stride)
        elif c.addressing == "legacy":
            plan = CompressorPrefillPlan.generate_verify_legacy(c.compress_ratio, rid, seq, D,
                                                                self.device)
        else:
            plan = CompressorPrefillPlan.generate_verify(
                c.compress_ratio, rid, seq, D, self.req_to_token, self.full_to_state, SWA_PAGE,
                c.ring_size, use_req_ring=c.addressing == "req_ring")
        kv = self._forward(x, plan)
        dsv4_ops.compress_norm_rope_store(
            kv, plan, norm_weight=self.norm_weight, norm_eps=1e-6, freq_cis=self.freqs,
            out_loc=out_loc, kvcache=self.cache, page_size=self.page_size)
        if c.online:
            spec.online_c128_mtp_write_prefix_states(
                x, seq, rid, self.req_to_token, self.ape, self.state, B, D, self.stride,
                head_dim=c.head_dim)
        return kv

    last_d = 1

    def verify(self, D: int, accepts: List[int]) -> None:
        c, B = self.case, self.B
        x, locs = self.verify_inputs(D, accepts)
        seq = torch.tensor(self.lens, dtype=torch.int64, device=self.device)
        out_loc = torch.tensor(locs, dtype=torch.int64, device=self.device)
        kv = self.verify_step(seq, x, out_loc, D)
        self.record_verify(kv, D, accepts)
        self.last_d = D

    def record_verify(self, kv, D: int, accepts: List[int]) -> None:
        # plan_c rows: every closing token of the batch (accepted or not), batch-major.
        c = self.case
        closing = [(b, self.lens[b] + i, i < accepts[b]) for b in range(self.B) for i in range(D)
                   if (self.lens[b] + i + 1) % c.compress_ratio == 0]
        self._record(kv, [(r, b, p) for r, (b, p, real) in enumerate(closing) if real])
        for b in range(self.B):
            self.lens[b] += accepts[b]

    def finish(self) -> None:
        """The commit the next forward would make (online)."""
        if self.case.online:
            seq = torch.tensor(self.lens, dtype=torch.int64, device=self.device)
            spec.online_c128_mtp_commit_pending(seq, self._rid(list(range(self.B))),
                                                self.req_to_token, self.pending, self.state,
                                                self.B, self.last_d, self.stride, self.B + 1,
                                                head_dim=self.case.head_dim)

    # ---- what a later step can read ------------------------------------------------------------
    def readable_slots(self) -> Dict[Tuple[int, int], int]:
        """{(b, pos): state slot} of every state row a later step may read: online the
        committed slot; offline the rows of [last_c - (win - cr), len)."""
        c = self.case
        out = {}
        r2t, f2s = self.req_to_token.cpu(), self.full_to_state.cpu()
        for b, n in enumerate(self.lens):
            if c.online:
                if n % 128:
                    out[(b, n)] = b
                continue
            first = max(0, (n // c.compress_ratio) * c.compress_ratio
                        - (c.window - c.compress_ratio))
            for pos in range(first, n):
                out[(b, pos)] = reference.state_slot(
                    c.addressing, b, pos, compress_ratio=c.compress_ratio,
                    ring_size=c.ring_size or c.window, swa_page_size=SWA_PAGE,
                    req_to_token=r2t, full_to_state=f2s)
        return out

    def live_cache(self) -> torch.Tensor:
        """The cache bytes of every real compressed token (pages of the live locations)."""
        live_pages = -(-self.B * self.K // self.page_size)
        return self.cache[:live_pages]


def make_rows(case: Case, batch: int, length: int, seed: int) -> List[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [worlds.kv_score_rows(length, case.compress_ratio, case.head_dim, gen, 2.0)
            .to(case.dtype).float() for _ in range(batch)]


def bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu().contiguous()
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)
