"""Shared cases of the context-parallel prefill tests (tests/test_cp_prefill.py, contract 8):
ragged batches after a first prefill chunk, token splits over ranks, the single-rank
compress_forward and the whole-sequence oracle they are judged against, and the worker that
runs them in a real process group (torch.multiprocessing, gloo), followed by a
decode-context-parallel store of the merged rows.

A case is one compressor and a batch of requests (seq_len, extend_len): the prefix
(seq_len - extend_len tokens) was prefilled by an earlier single-rank step, so that windows of
the batch read state rows; the batch's ragged rows are then split over the ranks. Conformance:
* the merged rows equal the single-rank compress_forward within 1e-6 (relative, and absolute
  against rows of magnitude about 1) and the oracle within the contract's 1e-4 (contract 4);
* the state buffer after the step equals the single-rank one bit for bit, on every rank;
* in a process group, every rank has the same rows.
"""
import json
import os
from dataclasses import dataclass
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

import torch

import dsv4_ops
from dsv4_ops import Compressor, CompressorPrefillPlan
from dsv4_ops.distributed import ContextParallelPlan, cp_compress
from dsv4_ops.testing import reference, worlds

RTOL = ATOL = 1e-6          # against the single-rank compress_forward
ORACLE_TOL = 1e-4           # against the float64 whole-sequence oracle (contract 4)
SPLITS = ("contiguous", "rr128", "uneven", "scattered")


@dataclass(frozen=True)
class Case:
    name: str
    compress_ratio: int
    head_dim: int
    requests: Tuple[Tuple[int, int], ...]   # (seq_len, extend_len) of the context-parallel step
    addressing: Optional[str] = None
    ring_size: Optional[int] = None
    dtype: torch.dtype = torch.float32      # input and state
    seed: int = 0


CASES = {c.name: c for c in [
    # ratio 4, SWA-paged (the band rows of every SWA page persist), a prefix in two requests
    Case("c4_hd512", 4, 512, ((301, 301), (200, 67), (45, 45), (530, 521)), seed=1),
    Case("c4_hd128", 4, 128, ((610, 610), (13, 6), (389, 130)), seed=2),
    # ratio 4 on a request ring with room for draft tokens (plan_w pad rows)
    Case("c4_hd128_ring16", 4, 128, ((257, 257), (96, 41)), addressing="req_ring",
         ring_size=16, seed=3),
    Case("c4_hd128_bf16", 4, 128, ((333, 333), (170, 99)), dtype=torch.bfloat16, seed=4),
    # ratio 128: windows that start in the state (prefix 100 and 500)
    Case("c128_hd512", 128, 512, ((700, 700), (300, 200), (129, 129), (1100, 600)), seed=5),
]}


class Batch(NamedTuple):
    """One case on one device, after the prefix chunk."""
    case: Case
    world: worlds.World
    plan: CompressorPrefillPlan   # the context-parallel step (host lengths, trimmed)
    rows: torch.Tensor            # [Q, row]: the step's ragged kv_score rows
    full: List[torch.Tensor]      # each request's whole sequence of rows (the oracle's input)
    state: torch.Tensor           # the state after the prefix chunk

    @property
    def num_q(self) -> int:
        return self.rows.shape[0]


def build(case: Case, device) -> Batch:
    """The case's world, its prefix chunk run by compress_forward, and the step's plan."""
    cr, hd = case.compress_ratio, case.head_dim
    comp = Compressor(cr, hd, addressing=case.addressing, ring_size=case.ring_size,
                      state_dtype=case.dtype)
    w = worlds.make_world(device, comp, case.requests, state_fill="randn", seed=case.seed,
                          input_dtype=case.dtype)
    gen = torch.Generator().manual_seed(case.seed + 1000)
    full = [worlds.kv_score_rows(s, cr, hd, gen).to(case.dtype) for s, _ in case.requests]
    seq = torch.tensor([s for s, _ in case.requests])
    prefix = torch.tensor([s - e for s, e in case.requests])
    if int(prefix.sum()) > 0:
        first = plan_for(w, prefix, prefix)
        rows = torch.cat([f[:p] for f, p in zip(full, prefix.tolist())]).to(w.device)
        dsv4_ops.compress_forward(w.state, rows, w.ape, first, head_dim=hd, compress_ratio=cr)
    plan = plan_for(w, seq, seq - prefix)
    rows = torch.cat([f[p:s] for f, (s, _), p in zip(full, case.requests, prefix.tolist())])
    return Batch(case, w, plan, rows.to(w.device), full, w.state.clone())


def plan_for(w: worlds.World, seq_lens, extend_lens, padded: bool = False) -> CompressorPrefillPlan:
    return CompressorPrefillPlan.generate(
        w.compress_ratio, w.rid, seq_lens, extend_lens, w.req_to_token, w.full_to_state,
        w.swa_page_size, w.ring, int(extend_lens.sum()), use_cuda_graph=padded,
        use_req_ring=w.use_req_ring)


def single_rank(b: Batch) -> Tuple[torch.Tensor, torch.Tensor]:
    """(compress_forward's fp32 rows, the state after it) of the whole step on one rank."""
    state = b.state.clone()
    out = torch.empty((b.plan.plan_c.shape[0], b.case.head_dim), device=b.rows.device)
    dsv4_ops.compress_forward(state, b.rows, b.world.ape, b.plan, head_dim=b.case.head_dim,
                              compress_ratio=b.case.compress_ratio, out=out)
    return out, state


def oracle(b: Batch) -> torch.Tensor:
    """The step's compressed tokens from each request's whole sequence, in plan order."""
    cr = b.case.compress_ratio
    outs = []
    for f, (s, e) in zip(b.full, b.case.requests):
        tokens = reference.compressed_tokens(f[:s].float(), b.world.ape.cpu(), cr,
                                             b.case.head_dim)
        outs.append(tokens[(s - e) // cr:])
    return torch.cat(outs)


def split(num_q: int, ranks: int, how: str, seed: int = 0) -> List[torch.Tensor]:
    """Each rank's ragged rows (int64, in the order the rank holds them):
    contiguous  equal consecutive ranges;
    rr128       blocks of 128 rows dealt round-robin;
    uneven      consecutive ranges of very different sizes (with 4 ranks one is empty);
    scattered   every row to a random rank, each rank's rows in a random order."""
    q = torch.arange(num_q)
    if how == "contiguous":
        return list(torch.tensor_split(q, ranks))
    if how == "rr128":
        return [q[(q // 128) % ranks == r] for r in range(ranks)]
    gen = torch.Generator().manual_seed(seed)
    if how == "uneven":
        weights = [1, 9] if ranks == 2 else [1, 12, 0, 7] + [3] * (ranks - 4)
        cuts = torch.tensor(weights[:ranks], dtype=torch.float64).cumsum(0)
        bounds = (cuts / cuts[-1] * num_q).round().long().tolist()
        return [q[a:b] for a, b in zip([0] + bounds[:-1], bounds)]
    if how == "scattered":
        owner = torch.randint(0, ranks, (num_q,), generator=gen)
        return [q[owner == r][torch.randperm(int((owner == r).sum()), generator=gen)]
                for r in range(ranks)]
    raise ValueError(f"unknown split {how!r}")


def compare(out: torch.Tensor, state: torch.Tensor, want: torch.Tensor,
            want_state: torch.Tensor, want_oracle: Optional[torch.Tensor] = None) -> List[str]:
    """Failures of one rank's result (empty: it conforms)."""
    failures = []
    refs = [("single-rank", want, RTOL)]
    if want_oracle is not None:
        refs.append(("oracle", want_oracle, ORACLE_TOL))
    for what, ref, tol in refs:
        try:
            torch.testing.assert_close(out.cpu().double(), ref.cpu().double(), rtol=tol,
                                       atol=tol)
        except AssertionError as e:
            failures.append(f"rows vs {what}: {str(e).splitlines()[:4]}")
    if not torch.equal(state.cpu().view(torch.uint8), want_state.cpu().view(torch.uint8)):
        differ = (state.cpu() != want_state.cpu()).any(-1).nonzero().flatten()[:8].tolist()
        failures.append(f"state differs from the single-rank state (slots {differ})")
    return failures


def dcp_store_failures(b: Batch, out: torch.Tensor, rank: int, world_size: int,
                       interleave: int = 2) -> List[str]:
    """The decode-context-parallel store of the merged rows (contract 9) in a process group:
    this rank stores its share into its own zeroed cache; the ranks' caches, all-gathered and
    put back at the global slots they stand for, must be the single-rank store's cache, and
    this rank's cache must hold nothing outside the slots it owns."""
    import torch.distributed as dist

    from test_dcp_store import format_geometry

    w = b.world
    fmt = "fp8_ds_mla" if b.case.head_dim == 512 else "fp4_indexer"
    ps = w.cache_page_size

    def store(cache, **dcp):
        dsv4_ops.compress_norm_rope_store(
            out, b.plan, norm_weight=w.norm_weight, norm_eps=1e-6, freq_cis=w.freqs,
            out_loc=w.out_loc, kvcache=cache, page_size=ps, use_fp4=fmt == "fp4_indexer", **dcp)

    single = w.kvcache(fmt, pages=w.num_pages)
    store(single)
    local = w.kvcache(fmt, pages=dsv4_ops.dcp_local_pages(w.num_pages, ps, world_size,
                                                          interleave))
    store(local, dcp_world_size=world_size, dcp_rank=rank, dcp_interleave=interleave)
    caches = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(caches, local)
    geo = format_geometry(fmt, ps)
    glob = torch.arange(w.num_pages * ps)
    union = torch.zeros_like(single)
    failures = []
    for r, cache in enumerate(caches):
        slot = dsv4_ops.dcp_local_slot(glob, world_size, r, interleave)
        own = slot >= 0
        union.view(-1)[geo.byte_index(glob[own], ps)] = cache.view(-1)[geo.byte_index(slot[own],
                                                                                      ps)]
        if r == rank:
            rest = cache.clone()
            rest.view(-1)[geo.byte_index(slot[own], ps)] = 0
            if bool(rest.any()):
                failures.append("the rank's cache changed bytes outside the slots it owns")
    if not bool(single.any()):
        failures.append("the single-rank store wrote nothing")
    if not torch.equal(union, single):
        bad = (union != single).any(-1).nonzero().flatten()[:8].tolist()
        failures.append(f"the union of the ranks' caches differs from the single-rank cache "
                        f"(pages {bad})")
    return failures


# ---- the real process group ------------------------------------------------------------------

def worker(rank: int, world_size: int, init_file: str, result_dir: str,
           names: Sequence[str]) -> None:
    """One rank of a gloo group: every case and split through dsv4_ops.distributed.cp_compress,
    each rank's failures written to result_dir/rank<r>.json ({"case/split": [failures]})."""
    import datetime

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=120))
    results: Dict[str, List[str]] = {}
    try:
        for name in names:
            b = build(CASES[name], "cpu")
            want, want_state = single_rank(b)
            want_oracle = oracle(b)
            for how in SPLITS:
                mine = split(b.num_q, world_size, how, seed=b.case.seed)[rank]
                cp = ContextParallelPlan.generate(b.plan, mine, b.num_q)
                state = b.state.clone()
                out = torch.empty_like(want)
                try:
                    cp_compress(
                        state, b.rows[mine].contiguous(), b.world.ape, cp,
                        head_dim=b.case.head_dim, compress_ratio=b.case.compress_ratio, out=out)
                    failures = compare(out, state, want, want_state, want_oracle)
                    first = out.clone()
                    dist.broadcast(first, 0)
                    if not torch.equal(first, out):
                        failures.append("rows differ from rank 0's")
                    results[f"{name}/{how}"] = failures
                    if how == "rr128":
                        results[f"{name}/dcp_store"] = dcp_store_failures(b, out, rank,
                                                                          world_size)
                except Exception as e:  # noqa: BLE001 (reported per case to the test)
                    results[f"{name}/{how}"] = [f"{type(e).__name__}: {e}"]
        dist.barrier()
    finally:
        with open(os.path.join(result_dir, f"rank{rank}.json"), "w") as f:
            json.dump(results, f)
        dist.destroy_process_group()
