"""The whole-sequence V4.1 oracle (dsv4_ops.testing.reference_v41) against hand-computed cases
and the properties contract V4.1 states (1.2 - 1.8, 3.2 - 3.4)."""
import math

import pytest
import torch

import dsv4_ops
from dsv4_ops import KVLayout
from dsv4_ops.testing import reference_v41 as ref

HD = 512


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _identity_freqs(max_pos):
    f = torch.zeros(max_pos, 64)
    f[:, 0::2] = 1.0
    return f


# ---------------------------------------------------------------------------------------
# 1.2 pair pooling
# ---------------------------------------------------------------------------------------
def test_pair_pool_is_the_two_way_softmax():
    g = _gen(1)
    rows = torch.randn(6, 2 * HD, generator=g) * 3
    pooled = ref.pair_pool(rows)
    assert pooled.shape == (3, HD) and pooled.dtype == torch.float64
    for grp in range(3):
        even, odd = rows[2 * grp].tolist(), rows[2 * grp + 1].tolist()
        for c in (0, 7, 300, 511):
            z0, z1 = even[HD + c], odd[HD + c]
            w0 = math.exp(z0) / (math.exp(z0) + math.exp(z1))
            expected = w0 * even[c] + (1 - w0) * odd[c]
            assert pooled[grp, c].item() == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_pair_pool_tie_cleared_partner_and_underflow():
    kv_even, kv_odd = torch.full((HD,), 3.0), torch.full((HD,), -1.0)
    tie = torch.stack([torch.cat([kv_even, torch.full((HD,), 0.5)]),
                       torch.cat([kv_odd, torch.full((HD,), 0.5)])])
    assert torch.equal(ref.pair_pool(tie)[0], torch.full((HD,), 1.0, dtype=torch.float64))
    # a cleared partner row (kv = 0, score = -inf) gets weight 0: the odd row as is
    cleared = torch.cat([torch.zeros(HD), torch.full((HD,), float("-inf"))])
    odd = torch.cat([torch.randn(HD, generator=_gen(2)), torch.randn(HD, generator=_gen(3))])
    assert torch.equal(ref.pair_pool(torch.stack([cleared, odd]))[0], odd[:HD].double())
    # a gap that underflows exp is a clean one-sided pick
    gap = torch.stack([torch.cat([kv_even, torch.full((HD,), 1e4)]),
                       torch.cat([kv_odd, torch.full((HD,), -1e4)])])
    assert torch.equal(ref.pair_pool(gap)[0], kv_even.double())
    # an odd count leaves the last (even) row unpaired
    assert ref.pair_pool(torch.randn(5, 2 * HD, generator=_gen(4))).shape == (2, HD)


# ---------------------------------------------------------------------------------------
# 1.3, 1.4 latents
# ---------------------------------------------------------------------------------------
def test_rms_norm_by_hand():
    x = torch.full((1, HD), 2.0).bfloat16()
    w = torch.full((HD,), 1.5).bfloat16()
    # r = 1 / sqrt(4 + eps); latent = bf16(2 * r * 1.5) = bf16(1.4999998...) = 1.5
    assert torch.equal(ref.rms_norm(x, w, 1e-6), torch.full((1, HD), 1.5).bfloat16())
    x = torch.zeros(1, HD).bfloat16()
    x[0, 0] = 4.0
    # mean(x^2) = 16 / 512 = 1/32: latent[0] = bf16(4 * sqrt(32)) = bf16(22.627...) = 22.625
    out = ref.rms_norm(x, torch.ones(HD).bfloat16(), 0.0)
    assert out[0, 0].item() == 22.625 and not out[0, 1:].float().any()


def test_ratio1_latent_is_its_row_normed():
    g = _gen(5)
    kv = torch.randn(7, HD, generator=g).bfloat16()
    w = (torch.rand(HD, generator=g) + 0.5).bfloat16()
    latent, pos = ref.latents(kv, 1, w, 1e-6)
    assert pos.tolist() == list(range(7)) and latent.dtype == torch.bfloat16
    for i in (0, 3, 6):
        x = kv[i].double()
        by_hand = (x * (1 / math.sqrt(x.pow(2).mean().item() + 1e-6)) * w.double()).bfloat16()
        assert torch.equal(latent[i], by_hand)
    # rows are independent: a reversed sequence gives the reversed latents
    assert torch.equal(ref.latents(kv.flip(0), 1, w, 1e-6)[0], latent.flip(0))
    # no pooling: ratio 1 with unit weight and a row of unit rms is the row itself
    unit = torch.where(torch.arange(HD) % 2 == 0, 1.0, -1.0)[None].bfloat16()
    assert torch.equal(ref.latents(unit, 1, torch.ones(HD).bfloat16(), 0.0)[0], unit)


def test_ratio2_latent_rounds_the_pooled_pair_to_bf16_first():
    g = _gen(6)
    rows = torch.randn(8, 2 * HD, generator=g)
    w = (torch.rand(HD, generator=g) + 0.5).bfloat16()
    latent, pos = ref.latents(rows, 2, w, 1e-6)
    assert pos.tolist() == [1, 3, 5, 7]
    for grp in range(4):
        z = torch.stack([rows[2 * grp, HD:], rows[2 * grp + 1, HD:]]).double()
        wts = torch.exp(z - z.max(0).values)
        wts = wts / wts.sum(0)
        pooled = (wts[0] * rows[2 * grp, :HD] + wts[1] * rows[2 * grp + 1, :HD]).bfloat16().double()
        r = 1 / math.sqrt(pooled.pow(2).mean().item() + 1e-6)
        assert torch.equal(latent[grp], (pooled * r * w.double()).bfloat16())
    with pytest.raises(ValueError, match="latents: ratio must be 1 or 2"):
        ref.latents(rows, 4, w, 1e-6)


# ---------------------------------------------------------------------------------------
# 1.5 RoPE
# ---------------------------------------------------------------------------------------
def test_rope_tail_and_group_positions():
    latent = torch.zeros(1, HD).bfloat16()
    latent[0, 10], latent[0, 448], latent[0, 449], latent[0, 510] = 7.0, 1.0, 2.0, 3.0
    freqs = _identity_freqs(4)
    freqs[2, 0], freqs[2, 1] = 0.0, 1.0          # position 2, pair 0: a quarter turn
    out = ref.rope_latent(latent, torch.tensor([2]), freqs)
    # (re, im) = (1, 2) -> (re*cos - im*sin, re*sin + im*cos) = (-2, 1)
    assert (out[0, 448].item(), out[0, 449].item()) == (-2.0, 1.0)
    assert out[0, 10].item() == 7.0 and out[0, 510].item() == 3.0
    assert ref.group_positions(2, torch.tensor([1, 3, 8, 9])).tolist() == [0, 2, 8, 8]
    assert ref.group_positions(1, torch.tensor([1, 3, 8])).tolist() == [1, 3, 8]
    # each rotated value is rounded to bf16
    freqs[3, 0], freqs[3, 1] = 0.3, 0.7
    out = ref.rope_latent(latent, torch.tensor([3]), freqs)
    assert out[0, 448].item() == torch.tensor(1 * 0.3 - 2 * 0.7).bfloat16().item()


@pytest.mark.parametrize("ratio", [1, 2])
def test_store_rotates_at_the_group_position(ratio):
    """Even positions rotate by identity, odd ones by a quarter turn: ratio 2 stores at the
    even first position of its pair, ratio 1 at its own."""
    g = _gen(7)
    length = 4
    rows = (torch.randn(length, HD, generator=g).bfloat16() if ratio == 1
            else torch.randn(length, 2 * HD, generator=g))
    w = torch.ones(HD).bfloat16()
    freqs = _identity_freqs(length)
    freqs[1::2, 0::2], freqs[1::2, 1::2] = 0.0, 1.0
    cache = dsv4_ops.kv_cache(KVLayout.V41_FP4, 2, 64)
    raw = torch.arange(64, 64 + length)
    latent, pos = ref.low_ratio_store(cache, rows, ratio, w, 1e-6, freqs, raw, "v41_fp4", 64)
    data, scales = ref.read_rows(cache, raw[pos] // ratio, KVLayout.V41_FP4, 64)
    stored = ref.decode_layout(data, scales, KVLayout.V41_FP4)
    turned = torch.stack([-latent[:, 449::2].float(), latent[:, 448::2].float()], -1).flatten(1)
    tail = torch.where((ref.group_positions(ratio, pos) % 2 == 1)[:, None], turned,
                       latent[:, 448:].float())
    expected = torch.cat([latent[:, :448].float(), tail], 1)
    data_e, scales_e = ref.encode_layout(expected, KVLayout.V41_FP4)
    assert torch.equal(stored, ref.decode_layout(data_e, scales_e, KVLayout.V41_FP4))


# ---------------------------------------------------------------------------------------
# 1.6 fp4 fake quantisation
# ---------------------------------------------------------------------------------------
def test_fake_quant_by_hand_and_sign_of_zero():
    v = torch.zeros(1, HD)
    # block 0: amax 6 -> s = e4m3(6 * fp32(1/6)) = 1, t = v
    v[0, :12] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.2, 0.2, -0.0, -5.5])
    q = ref.fp4_fake_quant(v)
    assert q[0, :12].tolist() == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 0.0, 0.0, 0.0, -6.0]
    signs = torch.signbit(q[0, :12]).tolist()
    assert signs[8] and not signs[9] and not signs[10]      # -0.2 -> -0.0; -0.0 and 0.2 -> +0
    assert not torch.signbit(q[0, 16:]).any()                # exact zeros stay +0
    # block 1: amax 0.03 -> s = e4m3(0.005), the subnormal 3 * 2^-9; t = 5.12 -> 6, -0.68 -> -0.5
    v[0, 16], v[0, 17] = 0.03, -0.004
    q = ref.fp4_fake_quant(v)
    s = 3 * 2.0 ** -9
    assert q[0, 16].item() == 6 * s and q[0, 17].item() == -0.5 * s


def test_fake_quant_multiplies_by_one_sixth_and_v41_fp4_divides():
    """amax = 7.1249995 (fp32): amax * fp32(1/6) rounds to e4m3 1.25, amax / 6 to 1.125."""
    amax = torch.tensor(7.124999523162842, dtype=torch.float32)
    v = torch.zeros(1, HD)
    v[0, 0] = amax
    assert ref.fp4_fake_quant(v)[0, 0].item() == 6 * 1.25
    _, scales = ref.encode_layout(v, KVLayout.V41_FP4)
    assert scales[0, 0].item() == 0x39                       # e4m3 1.125


def test_fake_quant_is_on_the_grid_and_exact_in_bf16():
    v = (torch.randn(16, HD, generator=_gen(8)) * 4).bfloat16().float()
    q = ref.fp4_fake_quant(v)
    assert torch.equal(q.bfloat16().float(), q)
    assert torch.equal(ref.fp4_fake_quant(q), q)             # idempotent on its grid


# ---------------------------------------------------------------------------------------
# 3.2 - 3.4 encodings
# ---------------------------------------------------------------------------------------
def test_v41_fp8_scales_and_sign_of_zero():
    y = torch.zeros(3, HD)
    y[1, 0], y[1, 1] = 448.0, -0.0
    y[1, 32] = 449.0
    y[2, :32] = -0.0
    data, scales = ref.encode_layout(y, KVLayout.V41)
    assert data.shape == (3, 512) and scales.shape == (3, 16)
    assert scales[0].tolist() == [114] * 16                  # floor 2^-13 after the divide
    assert scales[1, :2].tolist() == [127, 128]              # 448/448 = 1; 449/448 -> 2
    assert data[1, 0].item() == 0x7E and data[1, 1].item() == 0x80
    assert data[2, :32].tolist() == [0x80] * 32 and data[2, 32:].tolist() == [0] * 480
    # V4's floor is applied before the divide: 2^-22 -> byte 105
    _, v4_scales = ref.encode_layout(torch.zeros(1, HD), KVLayout.V4)
    assert v4_scales[0].tolist() == [105] * 7
    # V4 RoPE dims are bf16, -0 as 0x8000
    y4 = torch.zeros(1, HD)
    y4[0, 448] = -0.0
    v4_data, _ = ref.encode_layout(y4, KVLayout.V4)
    assert v4_data.shape == (1, 576) and v4_data[0, 448:450].tolist() == [0x00, 0x80]


def test_v41_fp4_codes_by_hand():
    y = torch.zeros(2, HD)
    y[0, :16] = torch.tensor([6.0, 0.25, -0.25, -0.0, 0.75, 1.25, 1.75, 2.5,
                              3.5, 5.0, -6.0, 7.5, -0.1, 1.0, 0.5, 3.0])
    data, scales = ref.encode_layout(y, KVLayout.V41_FP4)
    assert data.shape == (2, 256) and scales.shape == (2, 32)
    # amax 7.5: s8 = e4m3(1.25) = 0x3A; t = y / 1.25
    assert scales[0, 0].item() == 0x3A
    y[0, :16] = torch.tensor([6.0, 0.25, -0.25, -0.0, 0.75, 1.25, 1.75, 2.5,
                              3.5, 5.0, -6.0, 6.0, -0.1, 1.0, 0.5, 3.0])
    data, scales = ref.encode_layout(y, KVLayout.V41_FP4)
    assert scales[0, 0].item() == 0x38                       # amax 6: s8 = 1.0
    codes = [6.0, 0.25, -0.25, -0.0, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -6.0, 6.0, -0.1, 1.0, 0.5, 3.0]
    expected = [0x7, 0x0, 0x8, 0x8, 0x2, 0x2, 0x4, 0x4, 0x6, 0x6, 0xF, 0x7, 0x8, 0x2, 0x1, 0x5]
    assert len(codes) == len(expected)
    nibbles = [data[0, k // 2].item() >> (4 * (k % 2)) & 0xF for k in range(16)]
    assert nibbles == expected
    assert scales[1].tolist() == [0x01] * 32                  # all-zero tiles: floor 2^-9
    big = torch.full((1, HD), 6000.0)
    assert ref.encode_layout(big, KVLayout.V41_FP4)[1][0].tolist() == [0x7E] * 32


def test_uniform_fp8_saturates():
    y = torch.zeros(1, HD)
    y[0, :4] = torch.tensor([500.0, -500.0, 1.0, -0.0])
    data, scales = ref.encode_layout(y, KVLayout.UNIFORM_FP8)
    assert data[0, :4].tolist() == [0x7E, 0xFE, 0x38, 0x80] and scales.shape == (1, 0)


@pytest.mark.parametrize("layout", list(KVLayout))
def test_encodings_round_trip(layout):
    g = _gen(9)
    y = (torch.randn(12, HD, generator=g) * torch.logspace(-3, 2, 12)[:, None]).bfloat16().float()
    data, scales = ref.encode_layout(y, layout)
    assert data.shape == (12, layout.data_bytes) and scales.shape == (12, layout.scales_written)
    back = ref.decode_layout(data, scales, layout)
    if layout.is_fp4:
        # the e2m1 grid point nearest to y / s (saturated at 6) times the tile's e4m3 scale
        s = scales.view(torch.float8_e4m3fn).float().repeat_interleave(16, dim=1)
        t = (y / s).abs().clamp(max=6)
        nearest = (t[..., None] - torch.tensor(ref.E2M1_GRID)).abs().min(-1).values
        assert torch.allclose(((back / s).abs() - t).abs(), nearest, atol=1e-5)
        assert torch.equal(torch.signbit(back), torch.signbit(y))   # -0 codes kept (0x8)
    else:
        tile = layout.tile_size if layout is not KVLayout.V4 else 64
        if layout is KVLayout.UNIFORM_FP8:
            unit = torch.ones_like(y)
        else:
            unit = torch.ldexp(torch.ones(12, scales.shape[1]),
                               scales.int() - 127).repeat_interleave(tile, dim=1)
            if layout is KVLayout.V4:
                unit = torch.cat([unit, torch.ones(12, 64)], 1)
        y_sat = y.clamp(-448, 448) if layout is KVLayout.UNIFORM_FP8 else y
        bound = torch.maximum(y_sat.abs() * 2.0 ** -4, unit * 2.0 ** -10)
        if layout is KVLayout.V4:
            bound[:, 448:] = y[:, 448:].abs() * 2.0 ** -8
        assert ((back - y_sat).abs() <= bound).all()


def test_stored_value_per_layout():
    rotated = (torch.randn(3, HD, generator=_gen(10)) * 2).bfloat16().float()
    assert torch.equal(ref.stored_value(rotated, KVLayout.V41_FP4_NEW), rotated)
    for layout in ("v4", "v41", "v41_new", "uniform_fp8"):
        assert torch.equal(ref.stored_value(rotated, layout), ref.fp4_fake_quant(rotated))


# ---------------------------------------------------------------------------------------
# 1.7 the store into a cache
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", list(KVLayout))
def test_low_ratio_store_slots(layout):
    g = _gen(11)
    length, ps = 6, 2
    rows = torch.randn(length, 2 * HD, generator=g)
    w = (torch.rand(HD, generator=g) + 0.5).bfloat16()
    freqs = torch.randn(length, 64, generator=g)
    raw = torch.tensor([0, 0, 8, 9, 10, 11])        # pair 0 padded; pairs 1, 2 at raw >> 1
    cache = dsv4_ops.kv_cache(layout, 4, ps)
    latent, pos = ref.low_ratio_store(cache, rows, 2, w, 1e-6, freqs, raw, layout, ps)
    assert pos.tolist() == [1, 3, 5]
    written = torch.zeros_like(cache, dtype=torch.bool).view(-1)
    for loc, grp in ((4, 1), (5, 2)):
        data, scales = ref.read_rows(cache, torch.tensor([loc]), layout, ps)
        rotated = ref.rope_latent(latent[grp:grp + 1], torch.tensor([2 * grp]), freqs)
        exp_d, exp_s = ref.encode_layout(ref.stored_value(rotated, layout), layout)
        assert torch.equal(data, exp_d) and torch.equal(scales, exp_s)
        d_at, s_at = layout.token_offsets(loc, ps)
        written[d_at:d_at + layout.data_bytes] = True
        written[s_at:s_at + layout.scales_written] = True
    assert not cache.view(-1)[~written].any()       # nothing else, slot 0 included


def test_ratio1_store_skips_padded_rows():
    g = _gen(12)
    kv = torch.randn(3, HD, generator=g).bfloat16()
    cache = dsv4_ops.kv_cache("v41", 2, 2)
    latent, _ = ref.low_ratio_store(cache, kv, 1, torch.ones(HD).bfloat16(), 1e-6,
                                    _identity_freqs(3), torch.tensor([0, 3, 0]), "v41", 2)
    assert latent.shape == (3, HD)                   # every row has its latent
    d_at, s_at = KVLayout.V41.token_offsets(3, 2)
    flat = cache.view(-1).clone()
    flat[d_at:d_at + 512] = 0
    flat[s_at:s_at + 16] = 0
    assert cache.view(-1)[d_at:d_at + 512].any() and not flat.any()


def test_store_accepts_an_fp8_view():
    y = torch.randn(2, HD, generator=_gen(13))
    a = dsv4_ops.kv_cache("v41_new", 2, 2)
    b = dsv4_ops.kv_cache("v41_new", 2, 2).view(torch.float8_e4m3fn)
    locs = torch.tensor([1, 2])
    ref.store_rows(a, y, locs, "v41_new", 2)
    ref.store_rows(b, y, locs, "v41_new", 2)
    assert a.any() and torch.equal(a, b.view(torch.uint8))


# ---------------------------------------------------------------------------------------
# 1.8 index-K
# ---------------------------------------------------------------------------------------
def test_low_ratio_out_loc():
    pos, raw = torch.tensor([0, 1, 2, 3]), torch.tensor([10, 11, 12, 13])
    assert ref.low_ratio_out_loc(2, pos, raw).tolist() == [-1, 5, -1, 6]
    assert ref.low_ratio_out_loc(1, pos, raw).tolist() == [10, 11, 12, 13]


def test_index_k_by_hand():
    k = torch.ones(1, 128).bfloat16()
    # norm -> bf16(1/sqrt(1 + eps)) = 1; stage 1: sc = 2^ceil(log2(1/6)) = 1/4, q = 4 * 1/4 = 1;
    # stage 2: e = ue8m0_ceil(1/6) = 125, code e2m1(1 * 4) = 6 -> bytes 0x66
    codes, exps = ref.index_k(k, torch.ones(128).bfloat16(), 1e-6, _identity_freqs(2),
                              torch.tensor([1]), 2)
    assert codes.tolist() == [[0x66] * 64] and exps.tolist() == [[125] * 4]


def test_index_k_stages_and_signs():
    g = _gen(14)
    k = torch.randn(6, 128, generator=g).bfloat16()
    k[0, :32] = torch.tensor([-1e-3] * 31 + [8.0]).bfloat16()
    k[1, :32] = torch.tensor([1e-5, -1e-5] * 16).bfloat16()   # a block far below the others
    w = (torch.rand(128, generator=g) + 0.5).bfloat16()
    freqs = torch.randn(8, 64, generator=g)
    pos = torch.tensor([1, 3, 5, 7, 2, 4])
    codes, exps = ref.index_k(k, w, 1e-6, freqs, pos, 2)
    nib = torch.stack([codes & 0xF, codes >> 4], -1).reshape(6, 128)
    assert not (nib == 0x8).any()                        # no sign on a zero magnitude
    assert ((exps >= 1) & (exps <= 254)).all()
    rotated = ref.rope_latent(ref.rms_norm(k, w, 1e-6), ref.group_positions(2, pos), freqs,
                              ref.INDEX_ROPE_FIRST)
    stage1 = ref._index_stage1(rotated)
    mag = torch.tensor(ref.E2M1_GRID)[(nib & 7).long()]
    back = torch.where(nib >= 8, -mag, mag) * torch.ldexp(
        torch.ones(6, 4), exps.int() - 127).repeat_interleave(32, 1)
    # the packer represents the stage-1 values exactly, but for the block under its 1e-4 floor
    # (exponent 114): the two stages' floors differ, that block's small negatives pack as +0
    assert exps[1, 0].item() == 114 and stage1[1, :32].abs().min() > 0
    assert not nib[1, :32].any()
    back[1, :32] = stage1[1, :32]
    assert torch.equal(back, stage1)
    # ratio 2 rotates at the group position: pos 1 and pos 0 give the same keys
    assert torch.equal(ref.index_k(k[:1], w, 1e-6, freqs, torch.tensor([0]), 2)[0], codes[:1])


def test_index_k_store_addressing():
    g = _gen(15)
    k = torch.randn(3, 128, generator=g).bfloat16()
    w = torch.ones(128).bfloat16()
    freqs = torch.randn(4, 64, generator=g)
    ps = 64
    cache = torch.zeros(2, 68 * ps, dtype=torch.uint8)
    pos, loc = torch.tensor([1, 2, 3]), torch.tensor([65, -1, 0])
    ref.index_k_store(cache, k, w, 1e-6, freqs, pos, loc, 2, ps)
    codes, exps = ref.index_k(k[:1], w, 1e-6, freqs, pos[:1], 2)
    flat = cache.view(-1).clone()
    assert torch.equal(flat[68 * ps + 64:68 * ps + 128], codes[0])
    assert torch.equal(flat[68 * ps + 64 * ps + 4:68 * ps + 64 * ps + 8], exps[0])
    flat[68 * ps + 64:68 * ps + 128] = 0
    flat[68 * ps + 64 * ps + 4:68 * ps + 64 * ps + 8] = 0
    assert not flat.any()
