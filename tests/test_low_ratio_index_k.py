"""dsv4::low_ratio_index_k_store (contract V4.1 1.8) against the oracle
(reference_v41.index_k_store): ratios 1 and 2, page sizes 64 and 128, rows with loc in {-1, 0}
and past the cache storing nothing, a hand-computed row, the Python layer."""
import pytest
import torch

import dsv4_ops
from dsv4_ops.testing import reference_v41 as ref

import low_ratio_cases as lr

MAX_POS = 200


def _case(seed, n, ps, pages=3):
    g = lr.gen(seed)
    k = lr.kv_rows(n, g, lr.INDEX_DIM)
    w = lr.norm_weight(g, lr.INDEX_DIM)
    freqs = lr.random_freqs(MAX_POS, g)
    pos = torch.randint(0, MAX_POS, (n,), generator=g)
    loc = torch.randperm(pages * ps - 1, generator=g)[:n] + 1
    cache = lr.random_bytes((pages, 68 * ps), g)
    return k, w, freqs, pos, loc, cache


def _run(device, k, w, freqs, pos, loc, cache, ps, ratio):
    d_cache = cache.clone().to(device)
    lr.OPS.low_ratio_index_k_store(k.to(device), w.to(device), lr.EPS, freqs.to(device),
                                   pos.to(device), loc.to(device), d_cache, ps, ratio)
    return d_cache.cpu()


@pytest.mark.parametrize("ps", [64, 128])
@pytest.mark.parametrize("ratio", [1, 2])
def test_against_oracle(device, ratio, ps):
    k, w, freqs, pos, loc, cache = _case(100 + ratio + ps, 40, ps)
    loc[1], loc[4], loc[9] = -1, 0, cache.shape[0] * ps + 1     # store nothing
    got = _run(device, k, w, freqs, pos, loc, cache, ps, ratio)
    want = cache.clone()
    keep = loc < cache.shape[0] * ps
    ref.index_k_store(want, k[keep], w, lr.EPS, freqs, pos[keep], loc[keep], ratio, ps)
    live = [int(v) for v in loc if 0 < int(v) < cache.shape[0] * ps]
    lr.assert_cache_near(got, want, cache, index_k_mask(cache.shape, live, ps),
                      f"index-K (ratio {ratio}, page {ps})")


def index_k_mask(shape, locs, ps):
    """bool [numel]: the 64 code bytes and 4 exponent bytes of index-K slots `locs`."""
    mask = torch.zeros(int(torch.Size(shape).numel()), dtype=torch.bool)
    for loc in locs:
        base = (loc // ps) * 68 * ps
        off = loc % ps
        mask[base + off * 64:base + off * 64 + 64] = True
        mask[base + 64 * ps + off * 4:base + 64 * ps + off * 4 + 4] = True
    return mask


def test_ratio2_rotates_at_the_group_position(device):
    """Ratio 2: positions 2g and 2g + 1 give the same bytes; ratio 1: they differ."""
    k, w, freqs, pos, loc, cache = _case(110, 1, 64)
    k = k.repeat(2, 1)
    pos = torch.tensor([6, 7])
    loc = torch.tensor([3, 4])
    for ratio, same in ((2, True), (1, False)):
        got = _run(device, k, w, freqs, pos, loc, cache, 64, ratio).view(-1)
        a = torch.cat([got[3 * 64:4 * 64], got[64 * 64 + 12:64 * 64 + 16]])
        b = torch.cat([got[4 * 64:5 * 64], got[64 * 64 + 16:64 * 64 + 20]])
        assert torch.equal(a, b) == same, ratio


@pytest.mark.parametrize("ratio", [1, 2])
def test_by_hand(device, ratio):
    """k = 1 everywhere, unit weight, identity rotation: the norm gives 1, stage 1 the scale
    1/4 (q = 1), stage 2 the exponent 125 and code e2m1(4) = 6: bytes 0x66 and 125."""
    ps = 64
    k = torch.ones(2, lr.INDEX_DIM).bfloat16()
    cache = lr.random_bytes((2, 68 * ps), lr.gen(111))
    got = _run(device, k, torch.ones(lr.INDEX_DIM).bfloat16(), lr.identity_freqs(8),
               torch.tensor([5, 6]), torch.tensor([70, 0]), cache, ps, ratio).view(-1)
    page = 68 * ps
    assert got[page + 6 * 64:page + 7 * 64].tolist() == [0x66] * 64
    assert got[page + 64 * ps + 6 * 4:page + 64 * ps + 7 * 4].tolist() == [125] * 4
    want = cache.clone().view(-1)
    want[page + 6 * 64:page + 7 * 64] = 0x66
    want[page + 64 * ps + 6 * 4:page + 64 * ps + 7 * 4] = 125
    lr.assert_same_bits(got, want, "index-K cache")


def test_python_layer(device):
    """dsv4_ops.index_k_norm_rope_pack_store: page_size from the cache width, complex
    freqs_cis; low_ratio_out_loc gives the slots."""
    ps, ratio = 128, 2
    k, w, freqs, pos, _, cache = _case(112, 10, ps)
    raw = torch.randperm(3 * ps * 2 - 2, generator=lr.gen(1))[:10] + 2
    raw = raw - (raw % 2) + (pos % 2)                  # parity follows the position
    loc = dsv4_ops.low_ratio_out_loc(ratio, pos.to(device), raw.to(device))
    assert loc.cpu().tolist() == ref.low_ratio_out_loc(ratio, pos, raw).tolist()
    cplx = torch.view_as_complex(freqs.view(MAX_POS, 32, 2).contiguous()).to(device)
    d_cache = cache.clone().to(device)
    dsv4_ops.index_k_norm_rope_pack_store(k.to(device), w.to(device), lr.EPS, cplx,
                                          pos.to(device), loc, d_cache, ratio=ratio)
    lr.assert_same_bits(d_cache, _run(device, k, w, freqs, pos, loc.cpu(), cache, ps, ratio),
                        "Python layer")


def test_index_dtypes_and_fp32_weight(device):
    """positions / loc int32 and an fp32 norm weight (the bf16 weight's values): the same
    bytes as int64 / bf16."""
    ps = 64
    k, w, freqs, pos, loc, cache = _case(113, 12, ps)
    want = _run(device, k, w, freqs, pos, loc, cache, ps, 2)
    lr.assert_same_bits(_run(device, k, w, freqs, pos.int(), loc.int(), cache, ps, 2), want,
                        "int32 indices")
    lr.assert_same_bits(_run(device, k, w.float(), freqs, pos, loc, cache, ps, 2), want,
                        "fp32 norm weight")
