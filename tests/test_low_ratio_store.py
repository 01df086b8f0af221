"""dsv4::kv_store (contract V4.1 4.2, the reference's fused_store_cache "flashmla") and
compress_norm_rope_store into the V4.1 layouts (3.5), against the oracle's layout encoders:
every layout at page sizes 2, 64 and 128, bf16 and fp32 rows, with and without in-kernel RoPE,
rows that store nothing, untouched bytes."""
import pytest
import torch

import dsv4_ops
from dsv4_ops import KVLayout
from dsv4_ops.testing import reference, reference_v41 as ref

import low_ratio_cases as lr
from test_store import pack_words, prefill_words

V41_FAMILY = tuple(layout for layout in lr.LAYOUTS
                   if layout not in (KVLayout.V4, KVLayout.UNIFORM_FP8))


def _v4_rows(v: torch.Tensor):
    """The reference's V4 store of v itself (no bf16 rounding of dims 0..447 first): e4m3
    codes with a UE8M0 exponent per 64, dims 448..511 bf16 (contract V4.1 4.2, kv_store)."""
    n = v.shape[0]
    nope = v[:, :448].reshape(n, 7, 64)
    e = reference.ue8m0_ceil(nope.abs().amax(-1).clamp(min=reference.SCALE_FLOOR)
                             / reference.FP8_MAX)
    codes = reference.e4m3_codes((nope * reference._pow2(127 - e)[..., None]).reshape(n, 448))
    tail = v[:, 448:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return torch.cat([codes, tail], 1), e.to(torch.uint8)


def kv_store_want(start, x, loc, freqs_rows, layout, ps):
    """start after the contract's kv_store of rows x at slots loc (>= 0, inside the cache)."""
    layout = KVLayout.parse(layout)
    v = x.float()
    if freqs_rows is not None:
        v = reference.rope(v.double(), torch.arange(x.shape[0]), freqs_rows, 448).float()
        if x.dtype == torch.bfloat16:
            v = ref.bf16(v)
    data, scales = _v4_rows(v) if layout is KVLayout.V4 else ref.encode_layout(v, layout)
    out = start.clone()
    flat = out.view(-1)
    for t, slot in enumerate(loc.tolist()):
        if 0 <= slot < start.shape[0] * ps:
            d, s = layout.token_offsets(slot, ps)
            flat[d:d + data.shape[1]] = data[t]
            flat[s:s + scales.shape[1]] = scales[t]
    return out


def _slots(loc, cache, ps, layout):
    live = [int(v) for v in loc if 0 <= int(v) < cache.shape[0] * ps]
    return lr.written_byte_mask(cache.shape, live, layout, ps)


def _kv_case(seed, n, layout, ps, dtype=torch.bfloat16, pages=None):
    g = lr.gen(seed)
    pages = pages or max(2, -(-(n + 2) // ps))
    x = (torch.randn(n, lr.HD, generator=g) * torch.pow(2.0, torch.randint(-6, 5, (n, 1),
                                                                          generator=g))).to(dtype)
    loc = torch.randperm(pages * ps - 1, generator=g)[:n] + 1    # distinct, slot 0 free
    cache = lr.cache_for(layout, pages, ps, g)
    return g, x, loc, cache


def _kv_store(device, x, loc, freqs_rows, cache, ps, layout):
    d_cache = cache.clone().to(device)
    lr.OPS.kv_store(x.to(device), loc.to(device),
                    None if freqs_rows is None else freqs_rows.to(device), d_cache, ps,
                    lr.layout_name(layout))
    return d_cache.cpu()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("ps", lr.PAGE_SIZES)
@pytest.mark.parametrize("layout", lr.LAYOUTS, ids=lr.LAYOUT_IDS)
def test_kv_store_every_layout(device, layout, ps, dtype):
    """No RoPE: the bytes of the layout's encoder, exactly; loc < 0 and pages past the cache
    store nothing, slot 0 is stored."""
    g, x, loc, cache = _kv_case(60 + ps, 20, layout, ps, dtype)
    loc[2], loc[5], loc[6] = -1, 0, cache.shape[0] * ps + 3
    got = _kv_store(device, x, loc, None, cache, ps, layout)
    want = kv_store_want(cache, x, loc, None, layout, ps)
    lr.assert_same_bits(got, want, f"kv_store cache ({layout.value}, page {ps})")
    assert not torch.equal(got, cache)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("ps", lr.PAGE_SIZES)
@pytest.mark.parametrize("layout", V41_FAMILY, ids=[v.value for v in V41_FAMILY])
def test_kv_store_with_rope(device, layout, ps, dtype):
    g, x, loc, cache = _kv_case(70 + ps, 20, layout, ps, dtype)
    loc[3] = -5
    freqs_rows = lr.random_freqs(20, g)
    got = _kv_store(device, x, loc, freqs_rows, cache, ps, layout)
    want = kv_store_want(cache, x, loc, freqs_rows, layout, ps)
    lr.assert_cache_near(got, want, cache, _slots(loc, cache, ps, layout),
                      f"kv_store with RoPE ({layout.value}, page {ps})")


def test_kv_store_rope_rounds_to_the_input_dtype(device):
    """fp32 rows (no rounding after RoPE): an identity rotation stores exactly what no RoPE
    stores; a quarter turn is exact too (a swap with a sign): the bytes of the swapped rows."""
    layout, ps = KVLayout.V41, 64
    g, x, loc, cache = _kv_case(80, 6, layout, ps, torch.float32)
    ident = lr.identity_freqs(6)
    lr.assert_same_bits(_kv_store(device, x, loc, ident, cache, ps, layout),
                        _kv_store(device, x, loc, None, cache, ps, layout), "identity RoPE")
    quarter = torch.zeros(6, 64)
    quarter[:, 1::2] = 1.0
    turned = x.clone()
    turned[:, 448::2], turned[:, 449::2] = -x[:, 449::2], x[:, 448::2]
    lr.assert_same_bits(_kv_store(device, x, loc, quarter, cache, ps, layout),
                        kv_store_want(cache, turned, loc, None, layout, ps), "quarter turn")


def test_python_fused_store_cache(device):
    """dsv4_ops.fused_store_cache: per-row freqs_cis complex [N, 32] or fp32 [N, 64]; the V4
    store without RoPE."""
    layout, ps = KVLayout.V41_FP4, 64
    g, x, loc, cache = _kv_case(81, 8, layout, ps, torch.bfloat16)
    freqs_rows = lr.random_freqs(8, g)
    want = _kv_store(device, x, loc, freqs_rows, cache, ps, layout)
    cplx = torch.view_as_complex(freqs_rows.view(8, 32, 2).contiguous())
    for f in (cplx, freqs_rows):
        d_cache = cache.clone().to(device)
        dsv4_ops.fused_store_cache(x.to(device), d_cache, loc.to(device), page_size=ps,
                                   type="flashmla", layout=layout, freqs_cis=f.to(device))
        lr.assert_same_bits(d_cache, want, "fused_store_cache")
    v4 = lr.cache_for(KVLayout.V4, cache.shape[0], ps, g)
    d_v4 = v4.clone().to(device)
    dsv4_ops.fused_store_cache(x.to(device), d_v4, loc.to(device), page_size=ps)
    lr.assert_same_bits(d_v4, kv_store_want(v4, x, loc, None, KVLayout.V4, ps), "V4 store")


# ---------------------------------------------------------------------------------------
# compress_norm_rope_store into the V4.1 layouts (contract V4.1 3.5)
# ---------------------------------------------------------------------------------------
CR, MAX_POS = 4, 256


def _cnrs_case(seed, n, kv_dtype, layout, ps=64):
    g = lr.gen(seed)
    kv = (torch.randn(n, lr.HD, generator=g) * 3).to(kv_dtype)
    w = torch.rand(lr.HD, generator=g) + 0.5
    freqs = lr.random_freqs(MAX_POS, g)
    pos = torch.randint(0, MAX_POS // CR - 1, (n,), generator=g) * CR
    pages = max(2, -(-(n + 2) // ps))
    loc = torch.randperm(pages * ps, generator=g)[:n]
    plan = pack_words(prefill_words([int(p) + CR for p in pos], list(range(n))))
    cache = lr.cache_for(layout, pages, ps, g)
    return kv, w, freqs, pos, loc, plan, cache


def _cnrs(device, kv, plan, w, freqs, loc, cache, ps, fmt="fp8_ds_mla", *layout):
    d_cache = cache.clone().to(device)
    lr.OPS.compress_norm_rope_store(kv.to(device), plan.to(device), w.to(device),
                                    freqs.to(device), loc.to(device), d_cache, False, CR,
                                    lr.EPS, ps, fmt, *layout)
    return d_cache.cpu()


def cnrs_want(start, kv, w, freqs, pos, loc, layout, ps):
    """Contract V4.1 3.5: norm with the weight in kv's dtype, y rounded to kv's dtype, RoPE,
    rounded again, all 512 dims encoded in the layout (no fake quant)."""
    layout = KVLayout.parse(layout)
    x = kv.double()
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + lr.EPS) * w.to(kv.dtype).double()
    y = y.to(kv.dtype).double()
    y = reference.rope(y, pos, freqs, 448).to(kv.dtype).float()
    data, scales = ref.encode_layout(y, layout)
    out = start.clone()
    flat = out.view(-1)
    for t, slot in enumerate(loc.tolist()):
        d, s = layout.token_offsets(slot, ps)
        flat[d:d + data.shape[1]] = data[t]
        flat[s:s + scales.shape[1]] = scales[t]
    return out


NON_V4 = tuple(layout for layout in lr.LAYOUTS if layout is not KVLayout.V4)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("layout", NON_V4, ids=[v.value for v in NON_V4])
def test_compress_norm_rope_store_v41_layouts(device, layout, kv_dtype):
    kv, w, freqs, pos, loc, plan, cache = _cnrs_case(90, 24, kv_dtype, layout)
    got = _cnrs(device, kv, plan, w, freqs, loc, cache, 64, "fp8_ds_mla", layout.value)
    want = cnrs_want(cache, kv, w, freqs, pos, loc, layout, 64)
    lr.assert_cache_near(got, want, cache, _slots(loc, cache, 64, layout),
                      f"compress_norm_rope_store ({layout.value})")


def test_compress_norm_rope_store_v4_keeps_its_bytes(device):
    """layout "v4" (explicit) writes exactly what the call without the argument writes."""
    kv, w, freqs, pos, loc, plan, cache = _cnrs_case(91, 12, torch.float32, KVLayout.V4)
    plain = _cnrs(device, kv, plan, w, freqs, loc, cache, 64)
    lr.assert_same_bits(_cnrs(device, kv, plan, w, freqs, loc, cache, 64, "fp8_ds_mla", "v4"),
                        plain, "layout v4")
    assert not torch.equal(plain, cache)


def test_compress_norm_rope_store_python_layout(device):
    """dsv4_ops.compress_norm_rope_store(..., layout=KVLayout.V41_FP4) with a plan object."""
    layout = KVLayout.V41_FP4
    kv, w, freqs, pos, loc, plan, cache = _cnrs_case(92, 8, torch.float32, layout)
    plan_obj = dsv4_ops.CompressorPrefillPlan(CR, plan.to(device),
                                              torch.zeros(0, 8, dtype=torch.uint8, device=device),
                                              torch.zeros(2, dtype=torch.int32))
    cplx = torch.view_as_complex(freqs.view(MAX_POS, 32, 2).contiguous()).to(device)
    d_cache = cache.clone().to(device)
    dsv4_ops.compress_norm_rope_store(kv.to(device), plan_obj, norm_weight=w.to(device),
                                      norm_eps=lr.EPS, freq_cis=cplx, out_loc=loc.to(device),
                                      kvcache=d_cache, page_size=64, layout=layout)
    lr.assert_same_bits(d_cache, _cnrs(device, kv, plan, w, freqs, loc, cache, 64,
                                       "fp8_ds_mla", layout.value), "Python layer")


def test_kv_store_padded_pages(device):
    layout, ps = KVLayout.V41_FP4, 2
    g, x, loc, cache = _kv_case(82, 10, layout, ps)
    pb = layout.page_bytes(ps)
    padded = torch.cat([cache, lr.random_bytes((cache.shape[0], 100), g)], 1)
    plain = _kv_store(device, x, loc, None, cache, ps, layout)
    got = _kv_store(device, x, loc, None, padded, ps, layout)
    lr.assert_same_bits(got[:, :pb], plain, "padded cache")
    lr.assert_same_bits(got[:, pb:], padded[:, pb:], "page padding")


def test_kv_store_index_dtypes_and_fp8_view(device):
    """loc int32 and a float8_e4m3fn view of the cache: the bytes of the int64 / uint8 call."""
    layout, ps = KVLayout.V41_NEW, 64
    g, x, loc, cache = _kv_case(83, 9, layout, ps)
    freqs_rows = lr.random_freqs(9, g)
    want = _kv_store(device, x, loc, freqs_rows, cache, ps, layout)
    lr.assert_same_bits(_kv_store(device, x, loc.int(), freqs_rows, cache, ps, layout), want,
                        "loc int32")
    d_cache = cache.to(device, copy=True)
    lr.OPS.kv_store(x.to(device), loc.to(device), freqs_rows.to(device),
                    d_cache.view(torch.float8_e4m3fn), ps, layout.value)
    lr.assert_same_bits(d_cache, want, "float8_e4m3fn view")
