"""The layout and allocation helpers (dsv4_ops.layout) against the numbers of the contract's
tables (docs/contract.md 1.1, 2, 2.1, 4), written out here, and a store through compress_norm_rope_store
into a cache of the helper's size that writes exactly where the oracle writes."""
import pytest
import torch

import dsv4_ops
from dsv4_ops import Compressor
from dsv4_ops.testing import reference, worlds


def test_window_and_row_widths():
    assert dsv4_ops.window_size(4) == 8 and dsv4_ops.window_size(128) == 128
    # contract 1.1: cr 4 rows kv_ovl|kv|score_ovl|score, cr 128 rows kv|score
    assert dsv4_ops.kv_score_row_width(4, 512) == 2048
    assert dsv4_ops.kv_score_row_width(4, 128) == 512
    assert dsv4_ops.kv_score_row_width(128, 512) == 1024
    assert dsv4_ops.kv_score_row_width(128, 128) == 256
    # contract 2: state rows are raw kv_score rows; the online state is max|sum|kv
    assert dsv4_ops.state_row_width(4, 512) == 2048
    assert dsv4_ops.state_row_width(128, 128) == 256
    assert dsv4_ops.state_row_width(128, 512, is_online=True) == 1536


def test_store_formats_and_page_bytes():
    # contract 4 table: (head_dim, data bytes per token, scale bytes written, scale stride)
    assert dict(dsv4_ops.STORE_FORMATS) == {
        "fp8_ds_mla": (512, 576, 7, 8), "bf16": (512, 1024, 0, 0),
        "fp8_indexer": (128, 128, 4, 4), "fp4_indexer": (128, 64, 4, 4)}
    assert dsv4_ops.STORE_FORMATS["fp4_indexer"].scale_stride == 4
    # page_bytes column: ceil(584 ps / 576) * 576, 1024 ps, 132 ps, 68 ps
    expected = {"fp8_ds_mla": {1: 1152, 2: 1728, 64: 37440, 256: 149760},
                "bf16": {1: 1024, 64: 65536}, "fp8_indexer": {1: 132, 64: 8448},
                "fp4_indexer": {1: 68, 128: 8704}}
    for fmt, by_ps in expected.items():
        for ps, nbytes in by_ps.items():
            assert dsv4_ops.cache_page_bytes(fmt, ps) == nbytes, (fmt, ps)
    cache = dsv4_ops.kv_cache("fp8_ds_mla", 3, 64)
    assert cache.dtype == torch.uint8 and cache.shape == (3, 37440) and not cache.any()


def test_store_format_of_reads_the_table():
    assert dsv4_ops.store_format_of(512) == "fp8_ds_mla"
    assert dsv4_ops.store_format_of(512, bf16_store=True) == "bf16"
    assert dsv4_ops.store_format_of(128) == "fp8_indexer"
    assert dsv4_ops.store_format_of(128, use_fp4=True) == "fp4_indexer"
    for fmt, spec in dsv4_ops.STORE_FORMATS.items():
        flags = dict(use_fp4=fmt == "fp4_indexer", bf16_store=fmt == "bf16")
        assert dsv4_ops.store_format_of(spec.head_dim, **flags) == fmt


def _max_slot_plus_one(addressing, cr, ring, n, sps=64, n_swa=0, offset=0):
    """1 + the largest slot of contract 2.1 over every request row < n / SWA location."""
    if addressing == "swa_paged":
        return 1 + max((swa // sps) * ring + swa % ring for swa in range(n_swa * sps))
    if addressing == "req_ring":
        return 1 + max(rid * ring + pos % ring for rid in range(n) for pos in range(2 * ring))
    if addressing == "legacy" and cr == 4:
        return 1 + max((2 * rid + (pos // 4) % 2) * 4 + pos % 4 for rid in range(n)
                       for pos in range(16))
    if addressing == "legacy":
        return 1 + max(rid * 128 + pos % 128 for rid in range(n) for pos in range(256))
    return 1 + max(max(rid + offset, rid) for rid in range(n))  # online: rid + offset and rid


@pytest.mark.parametrize("addressing,cr,ring,kw", [
    ("swa_paged", 4, 8, dict(num_swa_pages=5)), ("swa_paged", 4, 16, dict(num_swa_pages=3)),
    ("req_ring", 4, 8, dict(num_requests=3)), ("req_ring", 128, 256, dict(num_requests=2)),
    ("legacy", 4, None, dict(num_requests=3)), ("legacy", 128, None, dict(num_requests=2)),
    ("online", 128, None, dict(num_requests=4, state_slot_offset=3)),
    ("online", 128, None, dict(num_requests=4))])
def test_state_slots_cover_every_slot(addressing, cr, ring, kw):
    n = kw.get("num_requests", 0)
    want = _max_slot_plus_one(addressing, cr, ring, n, n_swa=kw.get("num_swa_pages", 0),
                              offset=kw.get("state_slot_offset", 0))
    got = dsv4_ops.state_slots(addressing, compress_ratio=cr, ring_size=ring, **kw)
    assert got == want
    comp = Compressor(cr, 512, addressing=addressing, ring_size=ring)
    assert comp.state_slots(**kw) == want
    state = comp.state_buffer(**kw)
    assert state.shape == (want, comp.state_row_width) and state.dtype == torch.float32
    assert not state.any()


def test_state_buffer_dtype_and_device():
    st = dsv4_ops.state_buffer(128, 512, 3, is_online=True, dtype=torch.bfloat16, device="cpu")
    assert st.shape == (3, 1536) and st.dtype == torch.bfloat16


def test_compressor_defaults():
    c4 = Compressor(4, 512)
    assert (c4.store_format, c4.addressing, c4.ring, c4.window) == ("fp8_ds_mla", "swa_paged", 8, 8)
    idx = Compressor(4, 128, "fp4_indexer", ring_size=16)
    assert idx.use_fp4 and not idx.bf16_store and idx.ring == 16
    c128 = Compressor(128, 512, "bf16")
    assert (c128.addressing, c128.ring, c128.kv_score_row_width) == ("req_ring", 128, 1024)
    assert c128.bf16_store and c128.cache_page_bytes(2) == 2048
    online = Compressor(128, 512, addressing="online")
    assert online.is_online and online.ring == 1 and online.state_row_width == 1536
    assert Compressor(4, 128, addressing="legacy").ring == 8


@pytest.mark.parametrize("call,fn,arg", [
    (lambda: dsv4_ops.window_size(8), "window_size", "compress_ratio"),
    (lambda: dsv4_ops.kv_score_row_width(4, 256), "kv_score_row_width", "head_dim"),
    (lambda: dsv4_ops.state_row_width(4, 512, is_online=True), "state_row_width", "is_online"),
    (lambda: dsv4_ops.state_slots("paged", compress_ratio=4), "state_slots", "addressing"),
    (lambda: dsv4_ops.state_slots("swa_paged", compress_ratio=128, ring_size=128,
                                  num_swa_pages=2), "state_slots", "addressing"),
    (lambda: dsv4_ops.state_slots("req_ring", compress_ratio=4, ring_size=6, num_requests=2),
     "state_slots", "ring_size"),
    (lambda: dsv4_ops.state_slots("req_ring", compress_ratio=4, ring_size=4, num_requests=2),
     "state_slots", "ring_size"),
    (lambda: dsv4_ops.state_slots("req_ring", compress_ratio=4, ring_size=8), "state_slots",
     "num_requests"),
    (lambda: dsv4_ops.state_slots("swa_paged", compress_ratio=4, ring_size=8), "state_slots",
     "num_swa_pages"),
    (lambda: dsv4_ops.state_slots("legacy", compress_ratio=4, ring_size=16, num_requests=1),
     "state_slots", "ring_size"),
    (lambda: dsv4_ops.state_slots("online", compress_ratio=4, num_requests=1), "state_slots",
     "is_online"),
    (lambda: dsv4_ops.state_buffer(4, 512, 6), "state_buffer", "num_slots"),
    (lambda: dsv4_ops.state_buffer(4, 512, 8, dtype=torch.float16), "state_buffer", "dtype"),
    (lambda: dsv4_ops.cache_page_bytes("fp8", 64), "cache_page_bytes", "store_format"),
    (lambda: dsv4_ops.cache_page_bytes("bf16", 48), "cache_page_bytes", "page_size"),
    (lambda: dsv4_ops.kv_cache("bf16", -1, 64), "kv_cache", "num_pages"),
    (lambda: Compressor(4, 512, "fp8_indexer"), "Compressor", "store_format"),
    (lambda: Compressor(128, 512, addressing="swa_paged"), "Compressor", "addressing"),
    (lambda: Compressor(4, 512, addressing="online"), "Compressor", "is_online"),
    (lambda: Compressor(128, 512, ring_size=192), "Compressor", "ring_size"),
])
def test_bad_values_name_function_and_argument(call, fn, arg):
    with pytest.raises(ValueError, match=rf"dsv4_ops\.{fn}: {arg} "):
        call()


@pytest.mark.parametrize("fmt", list(dsv4_ops.STORE_FORMATS))
def test_store_writes_exactly_inside_a_cache_of_the_helpers_size(device, fmt):
    """Every slot of a 3-page cache written once, through a prefill of one request: the op
    writes exactly the bytes the oracle writes (the bytes that come out the same from a 0x00
    and a 0xFF cache), none past the last page, and agrees with the oracle's values on nearly
    all of them (contract 4's slack)."""
    hd = dsv4_ops.STORE_FORMATS[fmt].head_dim
    comp = Compressor(4, hd, fmt)
    ps, pages = 16, 3
    n_tok = ps * pages * 4
    w = worlds.make_world(device, comp, [(n_tok, n_tok)], page_size=64, seed=3)
    plan = dsv4_ops.CompressorPrefillPlan.generate(
        4, w.rid, w.seq_lens_cpu, w.extend_lens_cpu, w.req_to_token, w.full_to_state,
        w.swa_page_size, w.ring, w.num_q)
    kv = dsv4_ops.compress_forward(w.state, w.kv_in, w.ape, plan, head_dim=hd, compress_ratio=4)
    pos, _ = w.closing_tokens()
    locs = torch.randperm(ps * pages, generator=torch.Generator().manual_seed(1))
    out_loc = torch.full((n_tok,), -1, dtype=torch.int64)
    out_loc[(pos.cpu() + 3)] = locs  # the closing token of window k is its row s - 1
    written = []
    for fill in (0x00, 0xFF):
        # The cache is the first `pages` rows of a larger allocation: a write past it shows.
        room = dsv4_ops.kv_cache(fmt, pages + 1, ps, device=device).fill_(fill)
        cache = room[:pages]
        assert cache.shape == comp.kv_cache(pages, ps).shape
        dsv4_ops.compress_norm_rope_store(
            kv, plan, norm_weight=w.norm_weight, norm_eps=1e-6, freq_cis=w.freqs,
            out_loc=out_loc.to(device), kvcache=cache, page_size=ps, use_fp4=comp.use_fp4,
            bf16_store=comp.bf16_store)
        assert bool((room[pages] == fill).all()), "bytes written past the cache"
        want = torch.full((pages, dsv4_ops.cache_page_bytes(fmt, ps)), fill, dtype=torch.uint8)
        reference.store(want, kv.cpu(), pos.cpu(), locs, w.norm_weight.cpu(), 1e-6,
                        w.freqs.cpu(), fmt, ps)
        written.append((cache.cpu(), want))
    (got0, want0), (got1, want1) = written
    region = want0 == want1                        # bytes the oracle writes (same either way)
    assert torch.equal(got0 == got1, region)       # ... are exactly the bytes the op writes
    assert int(region.sum()) >= ps * pages * (dsv4_ops.STORE_FORMATS[fmt].data_bytes
                                              + dsv4_ops.STORE_FORMATS[fmt].scale_bytes)
    agree = (got0 == want0)[region].double().mean()
    assert agree > 0.99, float(agree)
