"""dsv4::c2_norm_rope_store, decode (draft_len 1) and verify (draft_len D > 1), against the
whole-sequence oracle (contract V4.1 1.2 - 1.7, 2.1, 2.4, 2.5): mixed parity over rings 2 to
16, verify blocks with heads of both parities, padded rows aliasing live requests, every
layout and page size, and the replay identity (one verify launch = D decode launches, bitwise),
also after partial acceptance, across ring wrap and under CUDA-graph replay."""
import pytest
import torch

import dsv4_ops
import dsv4_ops.testing.reference_v41  # noqa: F401

import low_ratio_cases as lr
from low_ratio_cases import PAD, PairWorld

OPS = torch.ops.dsv4


def _start(world, heads):
    """Requests at positions `heads`: an odd head's partner parked by an earlier step."""
    for rid, p in heads.items():
        if p % 2:
            world.park(rid, p - 1)


@pytest.mark.parametrize("ring", [2, 4, 8, 16])
def test_decode_mixed_parity(device, ring):
    heads = {3: 7, 0: 20, 5: 0, 1: 1, 2: 33}
    world = PairWorld(device, {rid: 48 for rid in heads}, ring=ring, seed=ring)
    _start(world, heads)
    order = list(heads)
    for step in range(5):
        rows = [(rid, heads[rid]) for rid in order] + [PAD]       # the pad aliases rid 3
        world.decode(rows, alias=3)
        heads = {rid: p + 1 for rid, p in heads.items()}
        order = order[1:] + order[:1]


@pytest.mark.parametrize("ps", lr.PAGE_SIZES)
@pytest.mark.parametrize("layout", lr.LAYOUTS, ids=lr.LAYOUT_IDS)
def test_every_layout_and_page_size(device, layout, ps):
    """A prefill of three requests, then two decode steps (both parities)."""
    lengths = {0: 9, 2: 12, 1: 5}
    world = PairWorld(device, {rid: n + 2 for rid, n in lengths.items()}, ring=4,
                      layout=layout, page_size=ps, seed=7 + ps)
    start = world.cache.cpu().clone()
    world.prefill([(rid, 0, n) for rid, n in lengths.items()], pad_tail=2)
    for step in range(2):
        world.decode([(rid, n + step) for rid, n in lengths.items()])
    assert not torch.equal(world.cache.cpu(), start), "nothing stored: the case proves nothing"


@pytest.mark.parametrize("dtypes", [(lr.I32, lr.I32, lr.I32), (lr.I64, lr.I32, lr.I64)],
                         ids=["i32", "req_i32"])
def test_decode_index_dtypes(device, dtypes):
    """positions / req / raw_out_loc as int32: the contract's bytes."""
    heads = {0: 5, 1: 8, 2: 11}
    world = PairWorld(device, {rid: 16 for rid in heads}, ring=4, seed=11)
    _start(world, heads)
    for step in range(3):
        world.decode([(rid, p + step) for rid, p in heads.items()], dtypes=dtypes)


def test_fp8_cache_view_and_fp32_weight(device):
    world = PairWorld(device, {0: 8, 1: 8}, ring=4, seed=12)
    _start(world, {0: 3, 1: 7})
    x, pos, req, raw = world.inputs([(0, 3), (1, 7)], alias=0)
    base, other = world.clone(), world.clone()
    lat = [lr.random_bytes((2, lr.HD), lr.gen(1), torch.bfloat16).to(device) for _ in range(2)]
    base.launch(x, pos, req, raw, 1, lat[0])
    OPS.c2_norm_rope_store(x.to(device), other.state, other.d_w.float(), lr.EPS, other.d_freqs,
                           pos.to(device), req.to(device), raw.to(device),
                           other.cache.view(torch.float8_e4m3fn), other.ps, other.ring, 1,
                           other.layout.value, lat[1])
    lr.assert_same_bits(lat[1], lat[0], "latent")
    lr.assert_same_bits(other.cache, base.cache, "cache")
    lr.assert_same_bits(other.state, base.state, "ring")


def test_ring_rows_outside_the_state_are_skipped(device):
    """Even rows whose ring slot lies outside `state` (rid past it, rid < 0) park nothing."""
    world = PairWorld(device, {0: 8}, ring=4, seed=13)
    rows_past = world.state.shape[0] // world.ring + 3
    x = lr.kv_score_rows(3, world.g)
    pos = torch.tensor([2, 4, 6])
    req = torch.tensor([rows_past, -1, 0])
    raw = torch.tensor([8, 10, 12])
    world.decode([(rows_past, 2), (-1, 4), (0, 6)], inputs=(x, pos, req, raw))


def test_padded_rows_aliasing_live_requests_write_nothing(device):
    """Padded rows (raw_out_loc 0, position 0) with the rid of a live request, in decode and
    verify (a whole padded block): no ring row, no cache byte, no latent row."""
    world = PairWorld(device, {0: 16, 1: 16}, ring=8, seed=14)
    _start(world, {0: 3, 1: 4})
    world.decode([PAD, (0, 3), PAD, (1, 4), PAD], alias=0)
    world.decode([(1, 5), PAD], alias=1)
    world.decode([(0, 4), (0, 5), (0, 6)] + [PAD] * 3 + [(1, 6), (1, 7), (1, 8)], draft_len=3,
                 alias=0)
    world.decode([PAD] * 6, draft_len=3, alias=1)


VERIFY = [(4, 3, 8), (3, 5, 8), (2, 6, 8)]


def _verify_rows(heads, d):
    return [(rid, heads[rid] + j) for rid in heads for j in range(d)]


def _check_replay(world, rows, d, alias):
    """The verify launch (checked against the contract) equals d decode launches over its
    columns on a copy: latent, ring and cache bitwise."""
    inputs = world.inputs(rows, alias)
    latent0 = lr.random_bytes((len(rows), lr.HD), world.g, torch.bfloat16)
    replay = world.clone()
    by_columns = replay.replay_by_columns(inputs, d, latent0)
    latent = world.decode(rows, draft_len=d, inputs=inputs, latent0=latent0)
    lr.assert_same_bits(latent, by_columns, "verify latent vs decode replay")
    lr.assert_same_bits(world.state, replay.state, "verify ring vs decode replay")
    lr.assert_same_bits(world.cache, replay.cache, "verify cache vs decode replay")


@pytest.mark.parametrize("b,d,ring", VERIFY, ids=[f"B{b}D{d}R{r}" for b, d, r in VERIFY])
def test_verify_blocks_equal_decode_replay(device, b, d, ring):
    """Blocks with heads of both parities and a padded block aliasing a live request."""
    heads = {rid: 9 + rid for rid in range(b)}     # parities alternate
    world = PairWorld(device, {rid: 9 + b + d for rid in range(b)}, ring=ring, seed=20 + d)
    _start(world, heads)
    rows = _verify_rows(heads, d) + [PAD] * d
    _check_replay(world, rows, d, alias=0)


@pytest.mark.parametrize("b,d,ring", VERIFY + [(3, 3, 4)],
                         ids=[f"B{b}D{d}R{r}" for b, d, r in VERIFY + [(3, 3, 4)]])
def test_verify_partial_acceptance_and_ring_wrap(device, b, d, ring):
    """Rounds of verify with a random number of accepted drafts: the next block starts at the
    committed position (rejected rows get new tokens); positions wrap the ring many times."""
    rounds = 8
    g = lr.gen(30 + d)
    heads = {rid: 2 * rid + (rid % 2) for rid in range(b)}
    world = PairWorld(device, {rid: heads[rid] + rounds * d + d for rid in range(b)}, ring=ring,
                      seed=31 + d)
    _start(world, heads)
    for _ in range(rounds):
        _check_replay(world, _verify_rows(heads, d), d, alias=0)
        for rid in heads:
            accepted = int(torch.randint(1, d + 1, (1,), generator=g))
            heads[rid] += accepted
            world.redraft(rid, heads[rid])
    assert max(heads.values()) >= ring + 2, "the ring never wrapped"


def test_verify_needs_ring_wider_than_draft(device):
    world = PairWorld(device, {0: 8}, ring=4, seed=40)
    x, pos, req, raw = world.inputs(_verify_rows({0: 1}, 4), alias=0)
    lat = torch.empty(4, lr.HD, dtype=torch.bfloat16, device=device)
    with pytest.raises((RuntimeError, ValueError),
                       match=r"dsv4\.c2_norm_rope_store.*ring.*wider than the draft"):
        world.launch(x, pos, req, raw, 4, lat)


def test_python_layer(device):
    """dsv4_ops.c2_decode_norm_rope_store: sglang's signature, complex freqs_cis, out=None
    allocates the latent, verify through draft_len."""
    world = PairWorld(device, {0: 12, 1: 12}, ring=4, seed=41)
    _start(world, {0: 3, 1: 5})
    x, pos, req, raw = world.inputs([(0, 3), (0, 4), (1, 5), (1, 6)], alias=0)
    replay = world.clone()
    latent0 = lr.random_bytes((4, lr.HD), world.g, torch.bfloat16)
    want = replay.replay_by_columns((x, pos, req, raw), 2, latent0)
    cplx = torch.view_as_complex(world.freqs.view(-1, 32, 2).contiguous()).to(device)
    latent = dsv4_ops.c2_decode_norm_rope_store(
        x.to(device), world.state, world.d_w, pos.to(device), req.to(device), raw.to(device),
        lr.EPS, cplx, world.cache, page_size=world.ps, ring_size=world.ring, draft_len=2,
        layout=world.layout)
    assert latent.shape == (4, lr.HD) and latent.dtype == torch.bfloat16
    odd = torch.tensor([0, 2])
    lr.assert_same_bits(latent.cpu()[odd], want[odd], "latent of the odd rows")
    lr.assert_same_bits(world.state, replay.state, "ring")
    lr.assert_same_bits(world.cache, replay.cache, "cache")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_verify_graph_replay_equals_decode_replay():
    """Capture one verify launch; change its inputs in place; each replay equals d decode
    launches (eager) over the columns, bitwise."""
    dev = torch.device("cuda", 0)
    b, d, ring = 3, 5, 8
    g = lr.gen(50)
    heads = {rid: 4 + rid for rid in range(b)}
    world = PairWorld(dev, {rid: 60 for rid in range(b)}, ring=ring, seed=51)
    _start(world, heads)
    n = b * d
    static = [t.to(dev) for t in world.inputs(_verify_rows(heads, d), alias=0)]
    latent = torch.empty(n, lr.HD, dtype=torch.bfloat16, device=dev)

    def step():
        OPS.c2_norm_rope_store(static[0], world.state, world.d_w, lr.EPS, world.d_freqs,
                               static[1], static[2], static[3], world.cache, world.ps, ring, d,
                               world.layout.value, latent)

    from test_cuda_graph import _capture
    saved = world.state.clone(), world.cache.clone()
    graph, _ = _capture(step)                    # runs step once, then captures it
    world.state.copy_(saved[0])
    world.cache.copy_(saved[1])
    for _ in range(4):
        inputs = world.inputs(_verify_rows(heads, d), alias=0)
        for t, v in zip(static, inputs):
            t.copy_(v)
        latent0 = lr.random_bytes((n, lr.HD), world.g, torch.bfloat16)
        latent.copy_(latent0)
        replay = world.clone()
        graph.replay()
        torch.cuda.synchronize()
        want = replay.replay_by_columns(inputs, d, latent0)
        lr.assert_same_bits(latent, want, "graph-replayed verify latent")
        lr.assert_same_bits(world.state, replay.state, "graph-replayed verify ring")
        lr.assert_same_bits(world.cache, replay.cache, "graph-replayed verify cache")
        for rid in heads:
            heads[rid] += int(torch.randint(1, d + 1, (1,), generator=g))
            world.redraft(rid, heads[rid])


def test_odd_rows_that_store_nothing(device):
    """An odd row whose slot raw >> 1 is past the cache, one whose RoPE position pos - 1 is
    outside freqs, one at compressed slot 0 (raw 1): latent written, cache untouched."""
    world = PairWorld(device, {0: 12, 1: 12, 2: 12}, ring=4, seed=60, max_pos=6)
    for rid, p in ((0, 8), (1, 2), (2, 4)):
        world.park(rid, p)
    rows = [(0, 9), (1, 3), (2, 5)]
    x, pos, req, raw = world.inputs(rows, alias=0)
    raw[1] = 2 * (world.pages * world.ps + 5) + 1
    raw[2] = 1
    start = world.cache.cpu().clone()
    world.decode(rows, inputs=(x, pos, req, raw))
    lr.assert_same_bits(world.cache, start, "cache")


@pytest.mark.parametrize("layout", lr.LAYOUTS, ids=lr.LAYOUT_IDS)
def test_sign_of_zero_by_hand(device, layout):
    """The crafted row of low_ratio_cases as the odd row of a pair whose partner is a cleared
    ring row (kv 0, score -inf: weight 0, pooled = the odd row, its -0 entries +0 as
    fmaf(0, 0, -0) is): the hand-computed bytes, with fp8 0x80 / bf16 0x8000 for the small
    negatives (contract V4.1 1.6)."""
    ps = 64
    state = lr.random_bytes((10, 2 * lr.HD), lr.gen(61), torch.float32)
    state[2] = torch.cat([torch.zeros(lr.HD), torch.full((lr.HD,), float("-inf"))])
    row = torch.cat([lr.sign_row(), torch.zeros(lr.HD)])[None]
    cache = lr.cache_for(layout, 1, ps, lr.gen(62))
    latent = torch.zeros(1, lr.HD, dtype=torch.bfloat16)
    d_state, d_cache, d_latent = lr.to(device, state, cache, latent)
    w = torch.full((lr.HD,), lr.SIGN_WEIGHT).bfloat16()
    OPS.c2_norm_rope_store(row.to(device), d_state, w.to(device), lr.EPS,
                           lr.identity_freqs(8).to(device), torch.tensor([3], device=device),
                           torch.tensor([0], device=device), torch.tensor([11], device=device),
                           d_cache, ps, 4, 1, layout.value, d_latent)
    pooled = torch.where(lr.sign_row() == 0, 0.0, lr.sign_row())
    lr.assert_same_bits(d_latent[0], pooled.bfloat16(), "crafted latent")
    lr.assert_same_bits(d_state, state, "ring")
    data, scales = dsv4_ops.testing.reference_v41.read_rows(d_cache.cpu(), torch.tensor([5]),
                                                            layout, ps)
    want_data, want_scales = lr.sign_row_bytes(layout, minus_zero=False)
    assert data[0].tolist() == want_data
    assert scales[0].tolist() == want_scales
    untouched = ~lr.written_byte_mask(cache.shape, [5], layout, ps)
    lr.assert_same_bits(d_cache.cpu().view(-1)[untouched], cache.view(-1)[untouched], "cache")
