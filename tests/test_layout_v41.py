"""The V4.1 layout helpers (dsv4_ops.KVLayout, pair_ring_size, the ratio-2 pair state) against
the numbers of the tables of contract V4.1 3.1 and 2.1, written out here."""
import pytest
import torch

import dsv4_ops
from dsv4_ops import KVLayout

# contract V4.1 3.1: name -> (enum, data bytes D, scale bytes S, tile, bytes per token, page_align,
# interleaved)
TABLE = {
    "v4": (0, 576, 8, 64, 584, 576, False),
    "v41": (1, 512, 16, 32, 528, 512, False),
    "v41_fp4": (2, 256, 32, 16, 288, 256, False),
    "uniform_fp8": (3, 512, 0, 512, 512, 512, False),
    "v41_new": (4, 512, 16, 32, 528, 528, True),
    "v41_fp4_new": (5, 256, 32, 16, 288, 288, True),
}
# contract V4.1 3.1 page_bytes examples: ps -> bytes
PAGE_BYTES = {
    "v4": {1: 1152, 2: 1728, 64: 37440, 128: 74880},
    "v41": {1: 1024, 2: 1536, 64: 33792, 128: 67584},
    "v41_fp4": {1: 512, 2: 768, 64: 18432, 128: 36864},
    "uniform_fp8": {1: 512, 2: 1024, 64: 32768, 128: 65536},
    "v41_new": {1: 528, 2: 1056, 64: 33792, 128: 67584},
    "v41_fp4_new": {1: 288, 2: 576, 64: 18432, 128: 36864},
}


def test_members_and_names():
    assert [m.value for m in KVLayout] == list(TABLE)
    assert [m.name for m in KVLayout] == ["V4", "V41", "V41_FP4", "UNIFORM_FP8", "V41_NEW",
                                          "V41_FP4_NEW"]
    assert KVLayout.V41_FP4 == "v41_fp4"                       # a str enum
    assert KVLayout.parse("v41_new") is KVLayout.V41_NEW
    assert KVLayout.parse("V41") is KVLayout.V41
    assert KVLayout.parse(KVLayout.V4) is KVLayout.V4
    with pytest.raises(ValueError, match=r"KVLayout.parse: layout must be one of"):
        KVLayout.parse("fp8_ds_mla")


@pytest.mark.parametrize("name", list(TABLE))
def test_table_facts(name):
    code, d, s, tile, bpt, align, interleaved = TABLE[name]
    layout = KVLayout(name)
    assert (layout.code, layout.data_bytes, layout.scale_bytes, layout.tile_size,
            layout.bytes_per_token, layout.page_align, layout.is_interleaved) == \
        (code, d, s, tile, bpt, align, interleaved)
    assert layout.head_dim == 512
    for ps, nbytes in PAGE_BYTES[name].items():
        assert layout.page_bytes(ps) == nbytes, (name, ps)


def test_v4_is_fp8_ds_mla():
    for ps in (1, 2, 64, 128, 256):
        assert KVLayout.V4.page_bytes(ps) == dsv4_ops.cache_page_bytes("fp8_ds_mla", ps)
    assert KVLayout.V4.scales_written == 7 and KVLayout.V41.scales_written == 16


def test_encodings_and_pairs():
    assert KVLayout.V41_NEW.encoding is KVLayout.V41
    assert KVLayout.V41_FP4_NEW.encoding is KVLayout.V41_FP4
    assert KVLayout.UNIFORM_FP8.encoding is KVLayout.UNIFORM_FP8
    assert [m.value for m in KVLayout if m.is_fp4] == ["v41_fp4", "v41_fp4_new"]
    assert KVLayout.V41.with_interleaved() is KVLayout.V41_NEW
    assert KVLayout.V41_FP4_NEW.with_interleaved(False) is KVLayout.V41_FP4
    with pytest.raises(ValueError, match="with_interleaved: interleaved"):
        KVLayout.V4.with_interleaved()
    # contract V4.1 3.5: identical, or a V41-encoded main next to a V41_FP4-encoded extra of the
    # same arrangement
    valid = {(m, m) for m in TABLE} | {("v41", "v41_fp4"), ("v41_new", "v41_fp4_new")}
    for kv in TABLE:
        for extra in TABLE:
            assert dsv4_ops.is_valid_kv_layout_pair(kv, extra) == ((kv, extra) in valid)


@pytest.mark.parametrize("ps", [2, 64, 128])
def test_token_offsets(ps):
    loc = 3 * ps + 1                                            # page 3, offset 1
    expected = {   # contract V4.1 3.1 addressing with the D, S and page bytes of the table
        "v4": (3 * PAGE_BYTES["v4"][ps] + 576, 3 * PAGE_BYTES["v4"][ps] + ps * 576 + 8),
        "v41": (3 * PAGE_BYTES["v41"][ps] + 512, 3 * PAGE_BYTES["v41"][ps] + ps * 512 + 16),
        "v41_fp4": (3 * PAGE_BYTES["v41_fp4"][ps] + 256,
                    3 * PAGE_BYTES["v41_fp4"][ps] + ps * 256 + 32),
        "uniform_fp8": (3 * ps * 512 + 512, 3 * ps * 512 + ps * 512),
        "v41_new": (3 * ps * 528 + 528, 3 * ps * 528 + 528 + 512),
        "v41_fp4_new": (3 * ps * 288 + 288, 3 * ps * 288 + 288 + 256),
    }
    for name, (data, scales) in expected.items():
        assert KVLayout(name).token_offsets(loc, ps) == (data, scales), name
        t_data, t_scales = KVLayout(name).token_offsets(torch.tensor([loc, 0]), ps)
        assert t_data.tolist() == [data, 0] and t_scales[0].item() == scales


def test_every_slot_of_a_page_lies_inside_it_without_overlap():
    for layout in KVLayout:
        for ps in (2, 64, 128):
            used = torch.zeros(2 * layout.page_bytes(ps), dtype=torch.int32)
            for loc in range(2 * ps):
                data, scales = layout.token_offsets(loc, ps)
                used[data:data + layout.data_bytes] += 1
                used[scales:scales + layout.scale_bytes] += 1
            assert int(used.max()) == 1 and int(used.sum()) == 2 * ps * layout.bytes_per_token


def test_kv_cache_of_a_layout():
    cache = dsv4_ops.kv_cache(KVLayout.V41_FP4, 3, 64)
    assert cache.dtype == torch.uint8 and cache.shape == (3, 18432) and not cache.any()
    assert dsv4_ops.kv_cache("v41_new", 2, 2).shape == (2, 1056)
    assert dsv4_ops.cache_page_bytes(KVLayout.UNIFORM_FP8, 128) == 65536
    with pytest.raises(ValueError, match=r"KVLayout.V41.page_bytes: page_size must be a power of two"):
        dsv4_ops.kv_cache(KVLayout.V41, 2, 48)
    with pytest.raises(ValueError, match=r"cache_page_bytes: store_format must be one of .* KVLayout"):
        dsv4_ops.kv_cache("v5", 2, 64)


def test_pair_ring_size():
    # contract V4.1 2.1: 2 without speculative decoding; 4 for n = 1..2, 8 for 3..6, 16 for 7..14
    expected = {0: 2, 1: 4, 2: 4, 3: 8, 6: 8, 7: 16, 14: 16, 15: 32}
    assert {n: dsv4_ops.pair_ring_size(n) for n in expected} == expected
    assert dsv4_ops.pair_ring_size() == 2
    for n in range(40):          # the smallest power of two >= n + 2, wider than a draft of n + 1
        ring = dsv4_ops.pair_ring_size(n)
        assert ring & (ring - 1) == 0 and ring >= n + 2 > ring // 2
    for bad in (-1, 1.5, None):
        with pytest.raises(ValueError, match="pair_ring_size: num_draft_tokens must be an int"):
            dsv4_ops.pair_ring_size(bad)


def test_pair_state_buffer():
    # contract V4.1 2.1: num_req_slots * ring + ring + 1 rows, rounded up to even; fp32 kv|score
    assert dsv4_ops.state_slots("pair_ring", compress_ratio=2, ring_size=2, num_requests=4) == 12
    assert dsv4_ops.state_slots("pair_ring", compress_ratio=2, ring_size=8, num_requests=3) == 34
    assert dsv4_ops.state_row_width(2, 512) == 1024 and dsv4_ops.kv_score_row_width(2, 512) == 1024
    state = dsv4_ops.state_buffer(2, 512, 34)
    assert state.shape == (34, 1024) and state.dtype == torch.float32 and not state.any()
    with pytest.raises(ValueError, match="state_slots: ring_size must be a multiple of "
                                         r"compress_ratio \(2\)"):
        dsv4_ops.state_slots("pair_ring", compress_ratio=2, ring_size=3, num_requests=1)
    with pytest.raises(ValueError, match="state_slots: addressing 'pair_ring' is the addressing "
                                         "of compress_ratio 2"):
        dsv4_ops.state_slots("req_ring", compress_ratio=2, ring_size=2, num_requests=1)
    with pytest.raises(ValueError, match="state_slots: addressing"):
        dsv4_ops.state_slots("pair_ring", compress_ratio=4, ring_size=8, num_requests=1)
    with pytest.raises(ValueError, match="state_buffer: dtype of the ratio-2 pair state"):
        dsv4_ops.state_buffer(2, 512, 4, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="state_row_width: head_dim must be 512 with compress_ratio 2"):
        dsv4_ops.state_row_width(2, 128)
    with pytest.raises(ValueError, match="state_buffer: num_slots must be a multiple"):
        dsv4_ops.state_buffer(2, 512, 33)
    with pytest.raises(ValueError, match="window_size: compress_ratio must be 4 or 128"):
        dsv4_ops.window_size(2)
    with pytest.raises(ValueError, match="Compressor: addressing must be one of"):
        dsv4_ops.Compressor(4, 512, addressing="pair_ring")
    with pytest.raises(ValueError, match="Compressor: compress_ratio must be 4 or 128"):
        dsv4_ops.Compressor(2, 512)
