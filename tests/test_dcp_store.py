"""Decode-context-parallel stores (docs/contract.md 9): every store op with dcp_world_size W,
dcp_rank and dcp_interleave I against the same call on one rank.

Each case stores one batch into a global cache of random bytes (the single-rank call, whose
bytes the op's own tests check against the contract's oracle), then into each rank's local
cache of dsv4_ops.dcp_local_pages pages: local slot l of rank r starts with the bytes of the
global slot it stands for (its random background), every other byte (pages past the share,
page padding) with other random bytes. After the call rank r's cache must be exactly its start
with every local slot replaced by that global slot's bytes of the single-rank cache: the union
of the ranks' caches is the single-rank cache slot for slot, and no rank changes a byte outside
the slots it owns. The latents and the pair-state ring (replicated) must equal the single-rank
call's on every rank, and W = 1 must be the call without the DCP arguments, byte for byte.
"""
from typing import Callable, Dict, NamedTuple

import pytest
import torch

import dsv4_ops
from dsv4_ops import KVLayout, STORE_FORMATS, dcp_local_pages, dcp_local_slot
from dsv4_ops.layout import token_byte_offsets

import low_ratio_cases as lr

OPS = torch.ops.dsv4
I32, I64 = torch.int32, torch.int64
PS = 16                      # slots a page: I = 64 spans pages, I = 2 does not
GLOBAL_PAGES = 9             # 144 global slots: not a multiple of every W * I
DCP = [(1, 1), (1, 64), (2, 1), (2, 2), (2, 64), (3, 2), (4, 1), (4, 2), (4, 64)]
DCP_IDS = [f"W{w}-I{i}" for w, i in DCP]


class SlotGeometry(NamedTuple):
    """Where a cache slot's bytes are (layout.token_byte_offsets)."""
    data_bytes: int
    scale_bytes: int
    page_bytes: int
    interleaved: bool = False

    def byte_index(self, slots: torch.Tensor, page_size: int = PS) -> torch.Tensor:
        """int64 [n, data + scale]: the flat cache bytes of each slot (page_bytes: the pages'
        of page_size slots)."""
        d, s = token_byte_offsets(slots, page_size, self.data_bytes, self.scale_bytes,
                                  self.page_bytes, self.interleaved)
        return torch.cat([d[:, None] + torch.arange(self.data_bytes),
                          s[:, None] + torch.arange(self.scale_bytes)], 1)


def format_geometry(fmt: str, page_size: int = PS) -> SlotGeometry:
    f = STORE_FORMATS[fmt]
    return SlotGeometry(f.data_bytes, f.scale_stride, dsv4_ops.cache_page_bytes(fmt, page_size))


def layout_geometry(layout) -> SlotGeometry:
    layout = KVLayout.parse(layout)
    return SlotGeometry(layout.data_bytes, layout.scale_bytes, layout.page_bytes(PS),
                        layout.is_interleaved)


# An index-K slot: 64 fp4 code bytes, 4 exponent bytes (the fp4_indexer format's page).
INDEX_K = format_geometry("fp4_indexer")


class Case(NamedTuple):
    """run(device, cache, dcp kwargs) -> the call's other outputs (CPU), from the same inputs
    every time (state and latent start from fixed bytes)."""
    geometry: SlotGeometry
    run: Callable[[torch.device, torch.Tensor, Dict[str, int]], Dict[str, torch.Tensor]]


def _distinct_slots(n: int, g: torch.Generator, low: int = 0) -> torch.Tensor:
    return torch.randperm(GLOBAL_PAGES * PS - low, generator=g)[:n] + low


# ---- the cases -----------------------------------------------------------------------------

def cnrs_case(fmt: str, is_decode: bool, layout=KVLayout.V4, n: int = 48, seed: int = 1) -> Case:
    """compress_norm_rope_store, ratio 4: a hand-packed DecodePlan (rows whose seq_len is not a
    multiple of 4 store nothing) or CompressPlan (invalid records store nothing), out_loc with
    some -1 entries."""
    g = lr.gen(seed)
    hd = STORE_FORMATS[fmt].head_dim
    cr, max_pos = 4, 64
    kv = torch.randn(n, hd, generator=g) * 2.0
    w = lr.norm_weight(g, hd).float()
    freqs = lr.random_freqs(max_pos, g)
    loc = _distinct_slots(n, g)
    loc[::7] = -1
    seq = cr * torch.randint(1, max_pos // cr, (n,), generator=g)
    words = torch.zeros(n, 4, dtype=I64)
    words[:, 0] = seq
    if is_decode:
        words[5::6, 0] += 1                                  # not closing a window
    else:
        words[:, 1] = torch.arange(n).flip(0) | (3 << 16)  # ragged_id: row of out_loc
        words[:, 2:] = -1
        words[4::9, 0] = 0xFFFFFFFF                          # invalid record
    words = torch.where(words >= 2 ** 31, words - 2 ** 32, words)
    plan = words.to(I32).contiguous().view(torch.uint8).reshape(n, 16)
    geo = format_geometry(fmt) if layout is KVLayout.V4 else layout_geometry(layout)

    def run(device, cache, dcp):
        OPS.compress_norm_rope_store(*lr.to(device, kv, plan, w, freqs, loc), cache, is_decode,
                                     cr, 1e-6, PS, fmt, KVLayout.parse(layout).value, **dcp)
        return {}
    return Case(geo, run)


def c1_case(layout, n: int = 40, seed: int = 2) -> Case:
    g = lr.gen(seed)
    kv, w, freqs = lr.kv_rows(n, g), lr.norm_weight(g), lr.random_freqs(32, g)
    positions = torch.randint(0, 32, (n,), generator=g)
    loc = _distinct_slots(n, g, low=1)
    loc[::6] = 0                                         # padded: nothing stored
    loc[3::11] = -1
    latent0 = lr.random_bytes((n, lr.HD), g, torch.bfloat16)

    def run(device, cache, dcp):
        latent = latent0.to(device, copy=True)
        OPS.c1_norm_rope_store(*lr.to(device, kv, w), lr.EPS, *lr.to(device, freqs, positions, loc),
                               cache, PS, lr.layout_name(layout), latent, **dcp)
        return {"latent": latent.cpu()}
    return Case(layout_geometry(layout), run)


def c2_case(layout, draft_len: int, n: int = 40, seed: int = 3) -> Case:
    """c2_norm_rope_store: one row a request (decode) or blocks of draft_len consecutive
    positions (verify); the ring holds every request's earlier rows."""
    g = lr.gen(seed)
    ring = 4 if draft_len == 1 else 8
    blocks = n // draft_len
    first = torch.randint(0, 24, (blocks,), generator=g)
    positions = (first[:, None] + torch.arange(draft_len)).reshape(-1)
    req = torch.arange(blocks).repeat_interleave(draft_len)
    raw = 2 * _distinct_slots(n, g, low=1) + (positions & 1)
    raw[2::9] = 0                                        # padded
    kv_score = lr.kv_score_rows(n, g)
    state0 = lr.kv_score_rows(blocks * ring, g)
    w, freqs = lr.norm_weight(g), lr.random_freqs(32, g)
    latent0 = lr.random_bytes((n, lr.HD), g, torch.bfloat16)

    def run(device, cache, dcp):
        state, latent = state0.to(device, copy=True), latent0.to(device, copy=True)
        OPS.c2_norm_rope_store(*lr.to(device, kv_score), state, *lr.to(device, w), lr.EPS,
                               *lr.to(device, freqs, positions, req, raw), cache, PS, ring,
                               draft_len, lr.layout_name(layout), latent, **dcp)
        return {"latent": latent.cpu(), "state": state.cpu()}
    return Case(layout_geometry(layout), run)


def c2_prefill_case(layout, seed: int = 4) -> Case:
    """c2_prefill_norm_rope_store: requests (first position, length) one after another, the
    pairs of a request (2j, 2j + 1) sharing a compressed slot."""
    g = lr.gen(seed)
    ring = 4
    reqs = [(0, 9), (5, 14), (2, 1), (7, 20)]
    positions = torch.cat([torch.arange(p, p + k) for p, k in reqs])
    req = torch.cat([torch.full((k,), i, dtype=I64) for i, (_, k) in enumerate(reqs)])
    key = req * 1000 + (positions >> 1)                  # one slot per (request, pair)
    _, pair = torch.unique(key, return_inverse=True)
    raw = 2 * _distinct_slots(int(pair.max()) + 1, g, low=1)[pair] + (positions & 1)
    raw[17] = 0                                          # a padded row inside a range
    n = positions.shape[0]
    starts = torch.tensor([0] + [k for _, k in reqs[:-1]], dtype=I32).cumsum(0).to(I32)
    lens = torch.tensor([k for _, k in reqs], dtype=I32)
    kv_score = lr.kv_score_rows(n, g)
    state0 = lr.kv_score_rows(len(reqs) * ring, g)
    w, freqs = lr.norm_weight(g), lr.random_freqs(32, g)
    latent0 = lr.random_bytes((n, lr.HD), g, torch.bfloat16)

    def run(device, cache, dcp):
        state, latent = state0.to(device, copy=True), latent0.to(device, copy=True)
        OPS.c2_prefill_norm_rope_store(
            *lr.to(device, kv_score), state, *lr.to(device, w), lr.EPS,
            *lr.to(device, freqs, positions, req, raw, starts, lens), cache, PS, ring,
            lr.layout_name(layout), latent, **dcp)
        return {"latent": latent.cpu(), "state": state.cpu()}
    return Case(layout_geometry(layout), run)


def index_k_case(ratio: int, n: int = 40, seed: int = 5) -> Case:
    g = lr.gen(seed)
    k, w = lr.kv_rows(n, g, lr.INDEX_DIM), lr.norm_weight(g, lr.INDEX_DIM)
    freqs = lr.random_freqs(32, g)
    positions = torch.randint(0, 32, (n,), generator=g)
    loc = _distinct_slots(n, g, low=1)
    loc[::5] = 0
    loc[1::8] = -1

    def run(device, cache, dcp):
        OPS.low_ratio_index_k_store(*lr.to(device, k, w), lr.EPS,
                                    *lr.to(device, freqs, positions, loc), cache, PS, ratio, **dcp)
        return {}
    return Case(INDEX_K, run)


def kv_store_case(layout, rope: bool, n: int = 40, seed: int = 6) -> Case:
    g = lr.gen(seed)
    x = lr.kv_rows(n, g)
    loc = _distinct_slots(n, g)
    loc[::6] = -1
    freqs_rows = lr.random_freqs(n, g) if rope else None

    def run(device, cache, dcp):
        OPS.kv_store(*lr.to(device, x, loc), None if freqs_rows is None else
                     freqs_rows.to(device), cache, PS, lr.layout_name(layout), **dcp)
        return {}
    return Case(layout_geometry(layout), run)


V41_FAMILY = [layout for layout in lr.LAYOUTS if layout not in (KVLayout.V4, KVLayout.UNIFORM_FP8)]
CASES = {
    **{f"cnrs-{fmt}-{'decode' if d else 'prefill'}": (cnrs_case, (fmt, d))
       for fmt in STORE_FORMATS for d in (True, False)},
    **{f"cnrs-fp8_ds_mla-{layout.value}": (cnrs_case, ("fp8_ds_mla", True, layout))
       for layout in lr.LAYOUTS if layout is not KVLayout.V4},
    **{f"c1-{layout.value}": (c1_case, (layout,)) for layout in lr.LAYOUTS},
    **{f"c2-{layout.value}": (c2_case, (layout, 1)) for layout in lr.LAYOUTS},
    **{f"c2_verify-{layout.value}": (c2_case, (layout, 4)) for layout in (KVLayout.V41,
                                                                           KVLayout.V41_FP4_NEW)},
    **{f"c2_prefill-{layout.value}": (c2_prefill_case, (layout,)) for layout in lr.LAYOUTS},
    **{f"index_k-r{ratio}": (index_k_case, (ratio,)) for ratio in (1, 2)},
    **{f"kv_store-{layout.value}": (kv_store_case, (layout, False)) for layout in lr.LAYOUTS},
    **{f"kv_store_rope-{layout.value}": (kv_store_case, (layout, True)) for layout in V41_FAMILY},
}


def _case(name: str) -> Case:
    fn, args = CASES[name]
    return fn(*args)


def _dcp(world_size: int, rank: int, interleave: int) -> Dict[str, int]:
    return {"dcp_world_size": world_size, "dcp_rank": rank, "dcp_interleave": interleave}


# ---- the check ---------------------------------------------------------------------------

def rank_start(background: torch.Tensor, geo: SlotGeometry, world_size: int, rank: int,
               interleave: int, local_pages: int, g: torch.Generator):
    """Rank `rank`'s local cache before the call: random bytes, with each local slot that
    stands for a global slot (inside the local cache) holding that slot's background. Returns
    (cache, the local slots' byte indices, the global slots' byte indices)."""
    glob = torch.arange(background.shape[0] * PS)
    local = dcp_local_slot(glob, world_size, rank, interleave)
    own = (local >= 0) & (local < local_pages * PS)
    start = lr.random_bytes((local_pages, geo.page_bytes), g)
    li, gi = geo.byte_index(local[own]), geo.byte_index(glob[own])
    start.view(-1)[li] = background.view(-1)[gi]
    return start, li, gi


def check_dcp_case(device, case: Case, world_size: int, interleave: int,
                   local_pages=None, seed: int = 0) -> None:
    g = lr.gen(100 + seed)
    geo = case.geometry
    background = lr.random_bytes((GLOBAL_PAGES, geo.page_bytes), g)
    single = background.to(device, copy=True)
    single_out = case.run(device, single, {})
    single = single.cpu()
    changed = (single != background).view(-1)[geo.byte_index(
        torch.arange(GLOBAL_PAGES * PS))].any(1)
    assert int(changed.sum()) >= 4, "the batch stores almost nothing: the test proves nothing"
    one = background.to(device, copy=True)
    one_out = case.run(device, one, _dcp(1, 0, interleave))
    lr.assert_same_bits(one, single, "W = 1 cache against the call without DCP arguments")
    for k, v in single_out.items():
        lr.assert_same_bits(one_out[k], v, f"W = 1 {k}")
    if local_pages is None:
        local_pages = dcp_local_pages(GLOBAL_PAGES, PS, world_size, interleave)
    written = 0
    for rank in range(world_size):
        start, li, gi = rank_start(background, geo, world_size, rank, interleave, local_pages, g)
        cache = start.to(device, copy=True)
        out = case.run(device, cache, _dcp(world_size, rank, interleave))
        want = start.clone()
        want.view(-1)[li] = single.view(-1)[gi]
        lr.assert_same_bits(cache, want, f"rank {rank} of W = {world_size}, I = {interleave}")
        written += int((want != start).sum())
        for k, v in single_out.items():
            lr.assert_same_bits(out[k], v, f"rank {rank} {k} (replicated)")
    assert written > 0


@pytest.mark.parametrize("world_size,interleave", DCP, ids=DCP_IDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_union_of_ranks_is_the_single_rank_cache(device, name, world_size, interleave):
    check_dcp_case(device, _case(name), world_size, interleave)


@pytest.mark.parametrize("name", ["cnrs-fp8_ds_mla-decode", "c1-v41", "c2_prefill-v41_fp4",
                                  "index_k-r2", "kv_store-v41_new"])
def test_entries_past_the_local_cache_write_nothing(device, name):
    """A local cache smaller than the rank's share: the entries whose local page lies past it
    are skipped (as any slot past the cache), the others land as usual."""
    check_dcp_case(device, _case(name), 4, 2, local_pages=1)


# ---- the ownership rule --------------------------------------------------------------------

def test_local_slot_round_robin_and_blocks():
    """I = 1: owner g % W, local g // W (the reference engine's); I > 1: blocks of I entries
    dealt round-robin, each rank's blocks packed one after another."""
    g = torch.arange(40)
    for w in (1, 2, 3, 4):
        for r in range(w):
            want = torch.where(g % w == r, g // w, torch.full_like(g, -1))
            assert torch.equal(dcp_local_slot(g, w, r, 1), want)
    assert [dcp_local_slot(v, 2, 1, 4) for v in range(16)] == \
        [-1] * 4 + [0, 1, 2, 3] + [-1] * 4 + [4, 5, 6, 7]
    assert [dcp_local_slot(v, 3, 2, 2) for v in range(18)] == \
        [-1] * 4 + [0, 1] + [-1] * 4 + [2, 3] + [-1] * 4 + [4, 5]
    assert dcp_local_slot(12345, 1, 0, 64) == 12345


@pytest.mark.parametrize("world_size,interleave", DCP, ids=DCP_IDS)
@pytest.mark.parametrize("pages,ps", [(9, 16), (1, 64), (7, 1), (0, 4)])
def test_local_slots_partition_and_fit(world_size, interleave, pages, ps):
    """Every global entry has exactly one owner; each rank's local slots are distinct and fit
    in dcp_local_pages pages, with less than a page of room left on the fullest rank."""
    glob = torch.arange(pages * ps)
    local = torch.stack([dcp_local_slot(glob, world_size, r, interleave)
                         for r in range(world_size)])
    assert torch.equal((local >= 0).sum(0), torch.ones_like(glob))
    for r in range(world_size):
        mine = local[r][local[r] >= 0]
        assert torch.equal(mine.unique(), mine.sort().values)
        as_ints = [dcp_local_slot(int(v), world_size, r, interleave) for v in glob[:50]]
        assert as_ints == local[r][:50].tolist()
    lp = dcp_local_pages(pages, ps, world_size, interleave)
    top = int(local.max()) + 1 if pages else 0
    assert top <= lp * ps
    assert lp == 0 or (lp - 1) * ps < -(-top // interleave) * interleave


@pytest.mark.parametrize("call,arg", [
    (lambda: dcp_local_slot(3, 0, 0, 1), "world_size"),
    (lambda: dcp_local_slot(3, 2, 2, 1), "rank"),
    (lambda: dcp_local_slot(3, 2, -1, 1), "rank"),
    (lambda: dcp_local_slot(3, 2, 0, 0), "interleave"),
    (lambda: dcp_local_pages(4, 16, 2, 0), "interleave"),
    (lambda: dcp_local_pages(4, 12, 2, 1), "page_size"),
    (lambda: dcp_local_pages(-1, 16, 2, 1), "num_pages"),
])
def test_helpers_bad_arguments(call, arg):
    with pytest.raises(ValueError, match=rf"dsv4_ops\.dcp_local_(slot|pages): {arg} "):
        call()


# ---- the Python layers -------------------------------------------------------------------

def test_python_layers_pass_the_dcp_arguments(device):
    """compress_norm_rope_store (plan API), the drop-in V4.1 functions: their dcp keywords
    give the raw op's bytes with the same arguments."""
    g = lr.gen(8)
    dev = torch.device(device)
    dcp = _dcp(4, 3, 2)
    n = 12
    x, loc = lr.kv_rows(n, g), _distinct_slots(n, g, low=1)
    cache0 = lr.random_bytes((GLOBAL_PAGES, KVLayout.V41.page_bytes(PS)), g)
    a, b = cache0.to(dev, copy=True), cache0.to(dev, copy=True)
    dsv4_ops.fused_store_cache(x.to(dev), a, loc.to(dev), page_size=PS, layout="v41", **dcp)
    OPS.kv_store(x.to(dev), loc.to(dev), None, b, PS, "v41", **dcp)
    lr.assert_same_bits(a, b, "fused_store_cache with DCP")
    assert not torch.equal(a.cpu(), cache0)
    w, freqs, pos = lr.norm_weight(g), lr.random_freqs(32, g), torch.randint(0, 32, (n,), generator=g)
    a, b = cache0.to(dev, copy=True), cache0.to(dev, copy=True)
    la = dsv4_ops.c1_decode_norm_rope_store(x.to(dev), w.to(dev), pos.to(dev), loc.to(dev),
                                            lr.EPS, freqs.to(dev), a, page_size=PS, layout="v41",
                                            **dcp)
    lb = torch.empty_like(la)
    OPS.c1_norm_rope_store(x.to(dev), w.to(dev), lr.EPS, freqs.to(dev), pos.to(dev), loc.to(dev),
                           b, PS, "v41", lb, **dcp)
    lr.assert_same_bits(a, b, "c1_decode_norm_rope_store with DCP")
    lr.assert_same_bits(la, lb, "c1_decode_norm_rope_store latent")

    from op_samples import decode_world
    wd = decode_world(dev, compress_ratio=4, head_dim=512)
    plan = dsv4_ops.CompressorDecodePlan.generate(4, wd.rid, wd.req_to_token, wd.full_to_state,
                                                  wd.seq_lens, 64, wd.ring)
    kv = torch.randn((2, 512), generator=g).to(dev)
    rank = int(wd.out_loc[0]) % 2
    a, b = wd.kvcache("fp8_ds_mla"), wd.kvcache("fp8_ds_mla")
    dsv4_ops.compress_norm_rope_store(kv, plan, norm_weight=wd.norm_weight, norm_eps=1e-6,
                                      freq_cis=wd.freqs, out_loc=wd.out_loc, kvcache=a,
                                      page_size=wd.cache_page_size, dcp_world_size=2,
                                      dcp_rank=rank)
    OPS.compress_norm_rope_store(kv, plan.plan_d, wd.norm_weight, wd.freqs_real, wd.out_loc, b,
                                 True, 4, 1e-6, wd.cache_page_size, "fp8_ds_mla", "v4", 2, rank, 1)
    lr.assert_same_bits(a, b, "compress_norm_rope_store (plan API) with DCP")


def test_debug_mode_checks_the_local_slot(device, debug_mode):
    """Debug mode checks an owned entry's local slot against this rank's cache and ignores the
    entries of other ranks (whose global slots lie past this rank's cache)."""
    from dsv4_ops import ops
    g = lr.gen(9)
    dev = torch.device(device)
    x = lr.kv_rows(2, g).to(dev)
    cache = lr.random_bytes((2, KVLayout.V41.page_bytes(PS)), g).to(dev)
    # global 2 PS + 1: rank 1's local slot PS (page 1); global 4 PS: rank 0's local 2 PS (page 2)
    loc = torch.tensor([2 * PS + 1, 4 * PS], device=dev)
    ops.kv_store_op(x, loc, None, cache, PS, "v41", dcp_world_size=2, dcp_rank=1)
    with pytest.raises(ValueError, match=r"dsv4\.kv_store: row 1 has a kvcache page outside"):
        ops.kv_store_op(x, loc, None, cache[:1].contiguous(), PS, "v41", dcp_world_size=2,
                        dcp_rank=0)
