"""dsv4::c1_norm_rope_store (contract V4.1 1.3 - 1.7, 2.3) against the whole-sequence oracle:
every layout at page sizes 2, 64 and 128; rows that store nothing; the sign of zero."""
import pytest
import torch

import dsv4_ops
from dsv4_ops import KVLayout
from dsv4_ops.testing import reference_v41 as ref

import low_ratio_cases as lr

MAX_POS = 300


def _case(seed, n, layout, ps, pages=None):
    g = lr.gen(seed)
    pages = pages or max(2, -(-(n + 2) // ps))
    kv = lr.kv_rows(n, g)
    w = lr.norm_weight(g)
    freqs = lr.random_freqs(MAX_POS, g)
    pos = torch.randint(0, MAX_POS, (n,), generator=g)
    loc = torch.randperm(pages * ps - 1, generator=g)[:n] + 1
    cache = lr.cache_for(layout, pages, ps, g)
    return g, kv, w, freqs, pos, loc, cache


@pytest.mark.parametrize("ps", lr.PAGE_SIZES)
@pytest.mark.parametrize("layout", lr.LAYOUTS, ids=lr.LAYOUT_IDS)
def test_every_layout_and_page_size(device, layout, ps):
    g, kv, w, freqs, pos, loc, cache = _case(10 + ps, 24, layout, ps)
    loc[3], loc[7] = 0, -1                       # padded rows: latent only
    latent, after = lr.check_c1(device, kv, w, freqs, pos, loc, cache, ps, layout, g)
    assert not torch.equal(after, cache), "nothing stored: the case proves nothing"


def test_rows_that_store_nothing(device):
    """out_loc <= 0, a page past the cache, a position outside freqs: the latent is written
    (every c1 row), the cache untouched."""
    layout, ps = KVLayout.V41_FP4, 2
    g, kv, w, freqs, pos, loc, cache = _case(3, 8, layout, ps, pages=4)
    loc = torch.tensor([0, -1, -7, 4 * ps, 4 * ps + 5, 5, 6, 7])
    pos[5] = MAX_POS                             # outside the table
    pos[6] = -1
    latent, after = lr.check_c1(device, kv, w, freqs, pos, loc, cache, ps, layout, g)
    stored = lr.written_byte_mask(cache.shape, [7], layout, ps)
    assert torch.equal(after.view(-1)[~stored], cache.view(-1)[~stored])
    assert not torch.equal(after.view(-1)[stored], cache.view(-1)[stored])


@pytest.mark.parametrize("variant", ["i32_indices", "fp32_weight", "fp8_cache"])
def test_argument_dtypes(device, variant):
    """positions / out_loc int32, an fp32 norm weight, a float8_e4m3fn view of the cache: the
    same bytes as the int64 / bf16 / uint8 call."""
    layout, ps = KVLayout.V41, 64
    g, kv, w, freqs, pos, loc, cache = _case(4, 10, layout, ps)
    latent0 = lr.random_bytes((10, lr.HD), g, torch.bfloat16)

    def run(pos_t, loc_t, w_t, cache_view):
        c = cache.clone().to(device)
        lat = latent0.clone().to(device)
        lr.c1_launch(kv.to(device), w_t.to(device), freqs.to(device), pos_t.to(device),
                     loc_t.to(device), cache_view(c), ps, layout, lat)
        return lat.cpu(), c.cpu()

    same = lambda c: c  # noqa: E731
    base = run(pos, loc, w, same)
    other = {"i32_indices": lambda: run(pos.int(), loc.int(), w, same),
             "fp32_weight": lambda: run(pos, loc, w.float(), same),
             "fp8_cache": lambda: run(pos, loc, w, lambda c: c.view(torch.float8_e4m3fn)),
             }[variant]()
    lr.assert_same_bits(other[0], base[0], "latent")
    lr.assert_same_bits(other[1], base[1], "cache")
    lr.assert_latents_conform(base[0], ref.latents(kv, 1, w, lr.EPS)[0])


def test_python_layer(device):
    """dsv4_ops.c1_decode_norm_rope_store: sglang's signature, complex freqs_cis, out=None
    allocates the latent; out= is written in place and returned."""
    layout, ps = KVLayout.V41_NEW, 64
    g, kv, w, freqs, pos, loc, cache = _case(5, 6, layout, ps)
    cplx = torch.view_as_complex(freqs.view(MAX_POS, 32, 2).contiguous())
    d_cache = cache.to(device, copy=True)
    latent = dsv4_ops.c1_decode_norm_rope_store(kv.to(device), w.to(device), pos.to(device),
                                                loc.to(device), lr.EPS, cplx.to(device), d_cache,
                                                page_size=ps, layout=layout)
    assert latent.shape == (6, lr.HD) and latent.dtype == torch.bfloat16
    assert latent.device == torch.device(device)
    lr.assert_latents_conform(latent.cpu(), ref.latents(kv, 1, w, lr.EPS)[0])
    want = lr.stored_rows(cache, latent.cpu(), pos, loc, freqs, layout, ps)
    lr.assert_same_bits(d_cache, want, "cache")
    out = torch.empty(6, lr.HD, dtype=torch.bfloat16, device=device)
    got = dsv4_ops.c1_decode_norm_rope_store(kv.to(device), w.to(device), pos.to(device),
                                             loc.to(device), lr.EPS, freqs.to(device),
                                             cache.clone().to(device), page_size=ps,
                                             layout="v41_new", out=out)
    assert got.data_ptr() == out.data_ptr()
    lr.assert_same_bits(out, latent, "out= latent")


@pytest.mark.parametrize("layout", lr.LAYOUTS, ids=lr.LAYOUT_IDS)
def test_sign_of_zero_by_hand(device, layout):
    """Small negatives that fake-quantise to -0 give fp8 0x80 (V41, V4 dims 0..447) and bf16
    0x8000 (V4 RoPE dims); the exact -0 input gives +0 (contract V4.1 1.6); V41_FP4 keeps every
    sign (3.3)."""
    ps = 64
    kv = lr.sign_row()[None].bfloat16()
    w = torch.full((lr.HD,), lr.SIGN_WEIGHT).bfloat16()
    g = lr.gen(6)
    cache = lr.cache_for(layout, 1, ps, g)
    latent, after = lr.check_c1(device, kv, w, lr.identity_freqs(4), torch.tensor([2]),
                                torch.tensor([5]), cache, ps, layout, g)
    lr.assert_same_bits(latent[0], kv[0], "crafted latent")
    data, scales = ref.read_rows(after, torch.tensor([5]), layout, ps)
    want_data, want_scales = lr.sign_row_bytes(layout)
    assert data[0].tolist() == want_data
    assert scales[0].tolist() == want_scales


@pytest.mark.parametrize("layout", [KVLayout.V41, KVLayout.V41_FP4_NEW], ids=["v41", "v41_fp4_new"])
def test_padded_pages(device, layout):
    """Pages wider than the layout's page bytes (by less than a doubling): the bytes of the
    unpadded cache at the same page offsets, the padding untouched."""
    ps = 2
    g, kv, w, freqs, pos, loc, cache = _case(7, 8, layout, ps)
    pb = layout.page_bytes(ps)
    padded = torch.cat([cache, lr.random_bytes((cache.shape[0], 40), g)], 1)
    latent0 = lr.random_bytes((8, lr.HD), g, torch.bfloat16)
    latent, plain = lr.check_c1(device, kv, w, freqs, pos, loc, cache, ps, layout, g)
    d_padded, d_lat = lr.to(device, padded, latent0)
    lr.c1_launch(kv.to(device), w.to(device), freqs.to(device), pos.to(device), loc.to(device),
                 d_padded, ps, layout, d_lat)
    lr.assert_same_bits(d_lat, latent, "latent")
    lr.assert_same_bits(d_padded[:, :pb], plain, "padded cache")
    lr.assert_same_bits(d_padded[:, pb:], padded[:, pb:], "page padding")
