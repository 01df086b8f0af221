"""compress_norm_rope_store (docs/contract.md 1.3 and 4) against an independent oracle.

The oracle lives in this file (an encoder independent of dsv4_ops.testing.reference): float64 RMSNorm / RoPE / Hadamard, then quantisation through
torch's own conversions (torch.bfloat16, torch.float8_e4m3fn after clamping, torch.frexp for
the UE8M0 ceiling, torch.bucketize for the e2m1 thresholds) and the byte layouts of the contract 4
table, written from the table. Random cases are compared with the contract's conformance slack;
"crafted" cases make the normed+roped values exact in fp32 (x = +-2^m, eps = 0, norm_weight =
the wanted values, identity rotation) so that the quantisers (numerics.h) are checked bit for
bit: every e4m3 code, e4m3 ties, arbitrary fp32 inputs to e4m3, bf16 round-to-nearest-even on
arbitrary fp32 patterns, the UE8M0 ceiling and the e2m1 tie rule.
"""
import math

import numpy as np
import pytest
import torch

import dsv4_ops
from dsv4_ops import ops

OP = "compress_norm_rope_store"
# The contract 4 table's layout facts (dsv4_ops.STORE_FORMATS; tests/test_layout.py checks them
# against the table). Scale bytes a store writes: fp8_ds_mla's byte 7 is unused and must stay
# untouched.
FORMATS = tuple(dsv4_ops.STORE_FORMATS)
HEAD_DIM = {k: f.head_dim for k, f in dsv4_ops.STORE_FORMATS.items()}
DATA_BYTES = {k: f.data_bytes for k, f in dsv4_ops.STORE_FORMATS.items()}
SCALE_STRIDE = {k: f.scale_stride for k, f in dsv4_ops.STORE_FORMATS.items()}
SCALE_BYTES = {k: f.scale_bytes for k, f in dsv4_ops.STORE_FORMATS.items()}
INVALID = 0xFFFFFFFF
E2M1_THRESHOLDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
HAD_SCALE32 = np.float32(1.0 / math.sqrt(128.0))  # fp32 1/sqrt(128)
F32 = torch.float32


# ---- plans ----------------------------------------------------------------------------------

def pack_words(words):
    """[n, 4] python ints (u32 / i32 words) -> uint8 [n, 16] little-endian records."""
    w = torch.tensor([[v & 0xFFFFFFFF for v in row] for row in words], dtype=torch.int64)
    w = torch.where(w >= 2**31, w - 2**32, w).to(torch.int32).reshape(-1, 4)
    return w.contiguous().view(torch.uint8).reshape(-1, 16)


def decode_words(seq_lens, write_locs):
    return [[s, wl, 0, wl // 4 if wl >= 0 else -1] for s, wl in zip(seq_lens, write_locs)]


def prefill_words(seq_lens, ragged_ids):
    """seq_len None -> the invalid CompressPlan record."""
    out = []
    for s, r in zip(seq_lens, ragged_ids):
        if s is None:
            out.append([INVALID, 0, -1, -1])
        else:
            out.append([s, (r & 0xFFFF) | (3 << 16), -1, 7])  # buffer_len / pages: ignored
    return out


def active_rows(words, is_decode, cr, out_loc, max_pos, num_pages, ps):
    """contract 4: (row, loc, pos) of every row that stores a token."""
    rows = []
    n_loc = len(out_loc)
    for t, (seq, w1, _, _) in enumerate(words):
        seq &= 0xFFFFFFFF
        if is_decode:
            w1s = w1 - 2**32 if (w1 & 0xFFFFFFFF) >= 2**31 else w1
            if seq % cr != 0 or w1s < 0:
                continue
            idx = t
        else:
            if seq == INVALID:
                continue
            idx = w1 & 0xFFFF
        if idx >= n_loc:
            continue
        pos = seq - cr
        if not 0 <= pos < max_pos:
            continue
        loc = int(out_loc[idx])
        if loc < 0 or loc // ps >= num_pages:
            continue
        rows.append((t, loc, pos))
    return rows


def random_freqs(max_pos, gen):
    ang = torch.rand(max_pos, 32, generator=gen, dtype=torch.float64) * 2 * math.pi
    return torch.stack([ang.cos(), ang.sin()], -1).reshape(max_pos, 64).to(F32).contiguous()


# ---- oracle ---------------------------------------------------------------------------------

def hadamard_matrix(n=128):
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h  # h[i, j] = (-1)^popcount(i & j), symmetric


H128 = hadamard_matrix()


def oracle_y(x, pos, w, eps, freqs):
    """float64 contract 1.3 steps 1-3, returned as fp32 [n, hd]."""
    x = x.double()
    hd = x.shape[1]
    y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w.double()
    f = freqs.double()[torch.as_tensor(pos, dtype=torch.int64)]
    c, s = f[:, 0::2], f[:, 1::2]
    re, im = y[:, hd - 64::2].clone(), y[:, hd - 63::2].clone()
    y[:, hd - 64::2] = re * c - im * s
    y[:, hd - 63::2] = re * s + im * c
    if hd == 128:
        y = (y @ H128) / math.sqrt(128.0)
    return y.to(F32)


def e4m3(v):
    return v.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)


def ue8m0_ceil(v):
    """Biased exponent of the smallest power of two >= v (v > 0 normal fp32)."""
    m, e = torch.frexp(v)
    return (torch.where(m == 0.5, e - 1, e) + 127).to(torch.int64)


def exp2i(k):
    return torch.exp2(k.to(torch.float64)).to(F32)


def bf16_bits(v):
    return v.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF


def e2m1(v):
    idx = torch.bucketize(v.abs().clamp(max=6.0), E2M1_THRESHOLDS)  # thresholds strictly below
    return idx + torch.where((v < 0) & (idx != 0), 8, 0)


def encode(y, fmt):
    """Independent contract 4 encoder of fp32 values y [n, hd] -> dict of fields."""
    n = y.shape[0]
    floor = torch.tensor(1e-4, dtype=F32)
    if fmt == "fp8_ds_mla":
        yb = y.to(torch.bfloat16).to(F32)
        g = yb[:, :448].reshape(n, 7, 64)
        e = ue8m0_ceil(torch.maximum(g.abs().amax(-1), floor) / 448.0)
        codes = e4m3(g * exp2i(127 - e)[..., None]).reshape(n, 448)
        return {"codes": codes, "scales": e, "rope": bf16_bits(y[:, 448:])}
    if fmt == "bf16":
        return {"bits": bf16_bits(y)}
    if fmt == "fp8_indexer":
        scale = torch.maximum(y.abs().amax(-1), floor) / 448.0
        return {"codes": e4m3(y / scale[:, None]), "scale": scale}
    g = y.reshape(n, 4, 32)
    e = ue8m0_ceil(torch.maximum(g.abs().amax(-1), floor) / 6.0)
    return {"nib": e2m1(g * exp2i(127 - e)[..., None]).reshape(n, 128), "scales": e}


# ---- reading the cache back -----------------------------------------------------------------

def slot_indices(fmt, ps, pb, locs):
    locs = torch.as_tensor(locs, dtype=torch.int64)
    page, off = locs // ps, locs % ps
    base = page * pb
    db, sb = DATA_BYTES[fmt], SCALE_BYTES[fmt]
    d = base[:, None] + off[:, None] * db + torch.arange(db)
    s = base[:, None] + db * ps + off[:, None] * SCALE_STRIDE[fmt] + torch.arange(sb)
    return d, s


def read_fields(fmt, data, sc):
    n = data.shape[0]
    if fmt == "fp8_ds_mla":
        rope = data[:, 448:576].contiguous().view(torch.int16).to(torch.int64) & 0xFFFF
        return {"codes": data[:, :448], "scales": sc.to(torch.int64), "rope": rope}
    if fmt == "bf16":
        return {"bits": data.contiguous().view(torch.int16).to(torch.int64) & 0xFFFF}
    if fmt == "fp8_indexer":
        return {"codes": data, "scale": sc.contiguous().view(F32).reshape(n)}
    d = data.to(torch.int64)
    nib = torch.stack([d & 0xF, d >> 4], -1).reshape(n, 128)
    return {"nib": nib, "scales": sc.to(torch.int64)}


def e4m3_ord(c):
    c = c.to(torch.int64)
    return torch.where((c & 0x80) != 0, -(c & 0x7F), c & 0x7F)


def e2m1_ord(c):
    c = c.to(torch.int64)
    return torch.where((c & 0x8) != 0, -(c & 0x7), c & 0x7)


def bf16_ord(b):
    b = b.to(torch.int64)
    return torch.where((b & 0x8000) != 0, -(b & 0x7FFF), b & 0x7FFF)


def assert_steps(got, exp, ord_fn, what, max_frac=0.005):
    d = (ord_fn(got) - ord_fn(exp)).abs()
    assert d.numel() == 0 or int(d.max()) <= 1, f"{what}: codes more than one step apart"
    bad = int((d != 0).sum())
    assert bad <= max_frac * d.numel(), f"{what}: {bad} of {d.numel()} codes differ"


def compare_fields(fmt, got, exp, exact=False):
    """contract 4 conformance (exact=True: every field bit-exact)."""
    if exact:
        for k in exp:
            g, e = got[k], exp[k]
            if k == "scale":
                g, e = g.view(torch.int32), e.view(torch.int32)
            mism = (g.to(torch.int64) != e.to(torch.int64)).nonzero()
            assert mism.numel() == 0, f"{fmt}.{k}: {mism.shape[0]} mismatches, first at {mism[:4].tolist()}: " \
                                      f"got {g[tuple(mism[0])]}, want {e[tuple(mism[0])]}"
        return
    if fmt == "fp8_ds_mla":
        assert_steps(got["codes"], exp["codes"], e4m3_ord, "e4m3 codes")
        assert torch.equal(got["scales"], exp["scales"]), "UE8M0 scales"
        assert_steps(got["rope"], exp["rope"], bf16_ord, "rope bf16", max_frac=1.0)
    elif fmt == "bf16":
        assert_steps(got["bits"], exp["bits"], bf16_ord, "bf16 values")
    elif fmt == "fp8_indexer":
        assert_steps(got["codes"], exp["codes"], e4m3_ord, "e4m3 codes")
        torch.testing.assert_close(got["scale"], exp["scale"], rtol=1e-5, atol=0)
    else:
        assert_steps(got["nib"], exp["nib"], e2m1_ord, "e2m1 codes")
        assert torch.equal(got["scales"], exp["scales"]), "UE8M0 scales"


def check_cache(fmt, ps, before, after, rows, expected, exact=False):
    """Every byte outside the written slots is untouched (fp8_ds_mla's unused scale byte 7
    included); the slots hold the expected fields."""
    assert after.shape == before.shape
    if not rows:
        assert torch.equal(after, before), "a store without active rows changed the cache"
        return
    pb = before.numel() // before.shape[0]
    fb, fa = before.reshape(-1), after.reshape(-1)
    d, s = slot_indices(fmt, ps, pb, [loc for _, loc, _ in rows])
    mask = torch.zeros(fb.numel(), dtype=torch.bool)
    mask[d.reshape(-1)] = True
    mask[s.reshape(-1)] = True
    assert torch.equal(fa[~mask], fb[~mask]), "bytes outside the written slots changed"
    compare_fields(fmt, read_fields(fmt, fa[d], fa[s]), expected, exact)


def store(device, fmt, kv, plan, w, freqs, out_loc, cache, is_decode, cr, eps, ps):
    dev_cache = cache.clone().to(device)
    ops.compress_norm_rope_store_op(kv.to(device), plan.to(device), w.to(device), freqs.to(device),
                                    out_loc.to(device), dev_cache, is_decode, cr, eps, ps, fmt)
    return dev_cache.cpu()


def random_kv(n, hd, gen):
    scale = torch.pow(10.0, torch.rand(n, 1, generator=gen) * 6 - 3)
    return (torch.randn(n, hd, generator=gen) * scale).to(F32)


def random_cache(num_pages, pb, gen, extra=0):
    return torch.randint(0, 256, (num_pages, pb + extra), generator=gen, dtype=torch.uint8)


# ---- random cases vs the float64 oracle -----------------------------------------------------

DTYPE_COMBOS = [  # (kv, norm_weight, out_loc)
    (torch.float32, torch.float32, torch.int32),
    (torch.bfloat16, torch.bfloat16, torch.int64),
    (torch.float32, torch.bfloat16, torch.int64),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("ps", [1, 64, 256])
@pytest.mark.parametrize("combo", range(len(DTYPE_COMBOS)))
def test_prefill_matches_oracle(device, fmt, ps, combo):
    kv_dt, w_dt, loc_dt = DTYPE_COMBOS[combo]
    gen = torch.Generator().manual_seed(1000 * combo + 10 * ps + FORMATS.index(fmt))
    hd, cr, n, max_pos = HEAD_DIM[fmt], (4 if combo != 1 else 128), 48, 4096
    capacity_pages = -(-2 * n // ps) + 1
    extra = 48 if ps == 64 else 0  # pages larger than the format needs: stride = actual bytes
    pb = dsv4_ops.cache_page_bytes(fmt, ps)
    cache = random_cache(capacity_pages, pb, gen, extra)
    n_loc = n + 7
    locs = torch.randperm(capacity_pages * ps, generator=gen)[:n_loc].to(torch.int64)
    locs[3], locs[9] = -1, capacity_pages * ps + 5  # absent, past the cache
    ragged = torch.randperm(n_loc, generator=gen)[:n].tolist()
    ragged[5] = n_loc + 2  # ragged_id outside out_loc
    seq = [cr * int(k) for k in torch.randint(1, max_pos // cr, (n,), generator=gen)]
    seq[7] = None  # invalid records
    seq[n - 1] = None
    seq[11] = cr * (max_pos // cr + 1)  # position out of freqs' range
    words = prefill_words(seq, ragged)
    kv = random_kv(n, hd, gen).to(kv_dt)
    w = (torch.rand(hd, generator=gen) + 0.5).to(w_dt)
    freqs = random_freqs(max_pos, gen)
    out_loc = locs.to(loc_dt)

    after = store(device, fmt, kv, pack_words(words), w, freqs, out_loc, cache, False, cr, 1e-6, ps)

    rows = active_rows(words, False, cr, locs.tolist(), max_pos, capacity_pages, ps)
    assert len(rows) >= n - 8
    t = [r for r, _, _ in rows]
    y = oracle_y(kv.float()[t], [p for _, _, p in rows], w.float(), 1e-6, freqs)
    check_cache(fmt, ps, cache, after.reshape(cache.shape), rows, encode(y, fmt))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("cr", [4, 128])
def test_decode_rows(device, fmt, cr):
    """Decode: only rows with seq_len % cr == 0 and write_loc >= 0 store, at out_loc[t]."""
    gen = torch.Generator().manual_seed(cr + FORMATS.index(fmt))
    hd, n, ps, max_pos = HEAD_DIM[fmt], 32, 64, 2048
    pages = 2
    pb = dsv4_ops.cache_page_bytes(fmt, ps)
    cache = random_cache(pages, pb, gen)
    seq = [cr * int(k) + (0 if i % 3 else int(1 + i % (cr - 1)))
           for i, k in enumerate(torch.randint(1, max_pos // cr, (n,), generator=gen))]
    seq[4] = 0  # closes "a window" at position -cr: out of range
    write = [int(v) for v in torch.randint(0, 1000, (n,), generator=gen)]
    write[6] = -1  # evicted token: no store even if the window closes
    seq[6] = cr * 5
    locs = torch.randperm(pages * ps, generator=gen)[:n].to(torch.int64)
    locs[9] = -1
    locs[12] = pages * ps  # first location past the cache
    seq[9], seq[12] = cr * 3, cr * 4
    words = decode_words(seq, write)
    kv = random_kv(n, hd, gen)
    w = (torch.rand(hd, generator=gen) + 0.5)
    freqs = random_freqs(max_pos, gen)

    after = store(device, fmt, kv, pack_words(words), w, freqs, locs.to(torch.int32), cache, True,
                  cr, 1e-6, ps)

    rows = active_rows(words, True, cr, locs.tolist(), max_pos, pages, ps)
    assert 3 <= len(rows) < n
    t = [r for r, _, _ in rows]
    y = oracle_y(kv[t], [p for _, _, p in rows], w, 1e-6, freqs)
    check_cache(fmt, ps, cache, after, rows, encode(y, fmt))


@pytest.mark.parametrize("fmt", FORMATS)
def test_inactive_rows_write_nothing(device, fmt):
    """Every reason for a row not to store, alone: the cache must stay byte-identical."""
    gen = torch.Generator().manual_seed(7)
    hd, ps, max_pos, cr = HEAD_DIM[fmt], 1, 64, 4
    pages = 8
    cache = random_cache(pages, dsv4_ops.cache_page_bytes(fmt, ps), gen)
    kv = random_kv(6, hd, gen)
    w = torch.ones(hd)
    freqs = random_freqs(max_pos, gen)
    cases = [  # (is_decode, records, out_loc, rows of freqs)
        # decode: window not closing; write_loc < 0; negative out_loc; loc past the cache;
        # out_loc shorter than the plan; position out of range
        (True, decode_words([5, 6, 7, 9, 10, 11], [0] * 6), [0, 1, 2, 3, 4, 5], max_pos),
        (True, decode_words([8, 8, 8, 8, 8, 8], [-1, -2, -1, -7, -1, -1]), [0, 1, 2, 3, 4, 5], max_pos),
        (True, decode_words([8, 12, 16, 20, 24, 28], [1] * 6), [-1, -2, pages, pages + 9, -1, 2**31 - 1], max_pos),
        (True, decode_words([8, 12, 16, 20, 24, 28], [1] * 6), [-1, -1, -1, -1], max_pos),
        (True, decode_words([0, 4 * 70, 4 * 17, 2**32 - 4, 4 * 65, 4 * 66], [1] * 6), [0, 1, 2, 3, 4, 5], 17),
        # prefill: invalid records; ragged_id outside out_loc; negative / past-the-cache loc;
        # position out of range
        (False, prefill_words([None] * 6, [0] * 6), [0, 1, 2, 3, 4, 5], max_pos),
        (False, prefill_words([8] * 6, [6, 7, 9, 100, 65535, 6]), [0, 1, 2, 3, 4, 5], max_pos),
        (False, prefill_words([8, 12, 16, 20, 24, 28], [0, 1, 2, 3, 4, 5]), [-1, -5, pages, 9, 2**31 - 1, -1], max_pos),
        (False, prefill_words([0, 4 * 70, 4 * 18, 2**32 - 4, 4 * 65, 2**31], [0, 1, 2, 3, 4, 5]), [0, 1, 2, 3, 4, 5], 17),
    ]
    for is_decode, words, locs, rows_of_freqs in cases:
        for loc_dt in (torch.int32, torch.int64):
            out_loc = torch.tensor(locs, dtype=loc_dt)
            fr = freqs[:rows_of_freqs].contiguous()
            expect = active_rows(words, is_decode, cr, locs, fr.shape[0], pages, ps)
            assert expect == [], (is_decode, words, locs)
            after = store(device, fmt, kv, pack_words(words), w, fr, out_loc, cache, is_decode, cr,
                          1e-6, ps)
            assert torch.equal(after, cache), (fmt, is_decode, words, locs)


def test_inactive_row_sanity(device):
    """The cases above do store once a single field is made valid (they are not vacuous)."""
    fmt, ps, cr = "fp4_indexer", 1, 4
    gen = torch.Generator().manual_seed(3)
    cache = random_cache(8, dsv4_ops.cache_page_bytes(fmt, ps), gen)
    kv = random_kv(2, 128, gen)
    freqs = random_freqs(64, gen)
    words = decode_words([8, 9], [0, 0])
    after = store(device, fmt, kv, pack_words(words), torch.ones(128), freqs,
                  torch.tensor([5, 6], dtype=torch.int32), cache, True, cr, 1e-6, ps)
    rows = active_rows(words, True, cr, [5, 6], 64, 8, ps)
    assert [r for r, _, _ in rows] == [0]
    y = oracle_y(kv[:1], [4], torch.ones(128), 1e-6, freqs)
    check_cache(fmt, ps, cache, after, rows, encode(y, fmt))


# ---- crafted exact cases: the quantisers bit for bit -----------------------------------------

def run_crafted(device, fmt, w, signs, m=None, kv_dtype=F32, ps=1):
    """Tokens whose normed+roped values are exactly signs * w in fp32: kv = signs * 2^m (the
    mean square is 4^m, so with eps = 0 the RMS factor is exactly 2^-m), norm_weight = w and
    every (cos, sin) = (1, 0). Rope dims must be finite and non-zero for the identity rotation
    to be exact. Returns the fields read back from the cache."""
    n, hd = signs.shape
    if m is None:
        m = torch.zeros(n, dtype=torch.int64)
    kv = (signs.to(F32) * exp2i(torch.as_tensor(m))[:, None]).to(kv_dtype)
    freqs = torch.zeros(8, 64, dtype=F32)
    freqs[:, 0::2] = 1.0
    words = prefill_words([4] * n, list(range(n)))  # position 0
    pages = -(-n // ps)
    pb = dsv4_ops.cache_page_bytes(fmt, ps)
    cache = torch.zeros(pages, pb, dtype=torch.uint8)
    after = store(device, fmt, kv, pack_words(words), w, freqs, torch.arange(n, dtype=torch.int64),
                  cache, False, 4, 0.0, ps)
    d, s = slot_indices(fmt, ps, pb, list(range(n)))
    flat = after.reshape(-1)
    return read_fields(fmt, flat[d], flat[s])


def random_f32_patterns(n, gen, exp_lo, exp_hi):
    """fp32 values with random sign and mantissa bits and biased exponents in [exp_lo, exp_hi]."""
    sign = torch.randint(0, 2, (n,), generator=gen, dtype=torch.int64) << 31
    ex = torch.randint(exp_lo, exp_hi + 1, (n,), generator=gen, dtype=torch.int64) << 23
    man = torch.randint(0, 1 << 23, (n,), generator=gen, dtype=torch.int64)
    bits = sign | ex | man
    return torch.where(bits >= 2**31, bits - 2**32, bits).to(torch.int32).view(F32)


def bits_to_f32(bits):
    b = torch.tensor(bits, dtype=torch.int64)
    return torch.where(b >= 2**31, b - 2**32, b).to(torch.int32).view(F32)


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
def test_bf16_store_is_exact_rne(device, kv_dtype):
    """bf16 format = round-to-nearest-even of the fp32 value, on arbitrary fp32 patterns:
    random mantissas over the whole exponent range, ties to even both ways, just-off ties,
    overflow to inf, subnormals, infinities and NaN (written as 0x7fc0)."""
    gen = torch.Generator().manual_seed(11)
    special = bits_to_f32([
        0x3F808000, 0x3F818000, 0xBF808000, 0xBF818000,  # exact ties: down to even / up to even
        0x3F807FFF, 0x3F808001, 0x3F817FFF, 0x3F818001,  # just below / above a tie
        0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F7FFF, 0x7F7F8000,  # max float -> inf; just below / at the tie
        0x00000001, 0x80000001, 0x00008000, 0x00018000, 0x007FFFFF, 0x00400000,  # subnormals
        0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF,  # inf, NaN
        0x00000000, 0x80000000, 0x3F800000, 0x3F80FFFF,
    ])
    for call in range(6):
        w = random_f32_patterns(512, gen, 1, 254)
        if call == 0:
            w[: special.numel()] = special
        w[448:] = random_f32_patterns(64, gen, 100, 150)  # rope dims: finite, non-zero
        signs = torch.where(torch.rand(6, 512, generator=gen) < 0.5, -1.0, 1.0)
        m = torch.tensor([0, 3, -7, 20, -40, 1])
        got = run_crafted(device, "bf16", w, signs, m, kv_dtype)
        y = signs * w
        exp = encode(y, "bf16")
        # NaN: torch's own conversions disagree on the bits (0x7fc0 scalar, 0xffff
        # vectorised); dsv4_ops writes the canonical quiet NaN 0x7fc0 whatever the sign.
        nan = y.isnan()
        assert int(nan.sum()) == 6 * 4 if call == 0 else int(nan.sum()) == 0
        assert bool((got["bits"][nan] == 0x7FC0).all())
        exp["bits"][nan] = 0x7FC0
        compare_fields("bf16", got, exp, exact=True)


def e4m3_values():
    """Every finite e4m3 code's value (0x00..0x7e and their negatives)."""
    codes = torch.arange(0, 0x7F, dtype=torch.uint8)
    pos = codes.view(torch.float8_e4m3fn).to(F32)
    return torch.cat([pos, -pos])


@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
def test_fp8_ds_mla_every_e4m3_code_and_ties(device, kv_dtype):
    """With a group amax of exactly 448 * 2^k the scale is 2^k (UE8M0 127 + k): every finite
    e4m3 value round-trips to its own code, and midpoints / near-midpoints (bf16 values) round
    to nearest even, as torch.float8_e4m3fn does. Also negative zero -> 0x80."""
    gen = torch.Generator().manual_seed(5)
    vals = e4m3_values()
    pos = vals[vals > 0]
    mids = (pos[:-1] + pos[1:]) / 2  # exact in bf16 (4 significant bits)
    mb = bf16_bits(mids)  # positive values: bits +-1 = the bf16 neighbours
    near = torch.cat([mb - 1, mb + 1]).to(torch.int16).view(torch.bfloat16).to(F32)
    tiny = torch.tensor([2.0**-10, 2.0**-11, 2.0**-10 * 1.0078125, 2.0**-10 * 0.9921875, 448.0])
    pool = torch.cat([vals, mids, -mids, near, -near, tiny, torch.tensor([-0.0])])
    ks = [0, -20, 7, -3, 12, -21, 30]  # per-group scale exponent (448 * 2^k above the 1e-4 floor)
    per_call = 7 * 63
    for start in range(0, pool.numel(), per_call):
        chunk = pool[start:start + per_call]
        body = torch.full((7 * 63,), 1.0)
        body[: chunk.numel()] = chunk
        groups = body.reshape(7, 63)
        w = torch.empty(512, dtype=F32)
        for g in range(7):
            w[64 * g] = 448.0  # the pin: amax of the group = 448 * 2^k
            w[64 * g + 1: 64 * g + 64] = groups[g]
            w[64 * g: 64 * g + 64] *= 2.0 ** ks[g]
        w[448:] = (torch.rand(64, generator=gen) + 0.25)
        signs = torch.ones(3, 512)
        signs[1] = torch.where(torch.rand(512, generator=gen) < 0.5, -1.0, 1.0)
        signs[2] = -1.0
        got = run_crafted(device, "fp8_ds_mla", w, signs, torch.tensor([0, 5, -5]), kv_dtype)
        y = signs * w
        exp = encode(y, "fp8_ds_mla")
        assert torch.equal(exp["scales"][0], torch.tensor([127 + k for k in ks]))
        compare_fields("fp8_ds_mla", got, exp, exact=True)
    # the exact e4m3 values did come back as their own codes (the oracle is torch's conversion)
    assert torch.equal(e4m3(vals).view(torch.float8_e4m3fn).to(F32), vals)


@pytest.mark.parametrize("fmt", ["fp8_ds_mla", "fp4_indexer"])
def test_ue8m0_scale_rounds_up(device, fmt):
    """amax / max_code just above a power of two: the scale must round UP (rounding down would
    saturate the largest codes). Also exact powers of two (no +1) and just below."""
    if fmt == "fp8_ds_mla":
        base = 448.0
        w = torch.full((512,), 0.5)
        # bf16 values (the format rounds to bf16 first): 450 = 448 + one bf16 ulp
        amaxes = [450.0, base, 446.0, 450.0 * 2**-9, 450.0 * 2**5, base * 2**-3, 450.0 * 2**10]
        for g, a in enumerate(amaxes):
            w[64 * g + 17] = a
        w[448:] = 0.75
        want = [128, 127, 127, 119, 133, 124, 138]
        got = run_crafted(device, fmt, w, torch.ones(2, 512))
        y = torch.ones(2, 512) * w
        exp = encode(y, fmt)
        assert exp["scales"][0].tolist() == want  # the oracle agrees with the hand-computed bytes
        compare_fields(fmt, got, exp, exact=True)
        # largest code of the first group: 450 / 2 = 225 -> 224 (0x76); a scale rounded down
        # would have saturated it to 448 (0x7e)
        assert int(got["codes"][0, 17]) == 0x76
    else:
        # fp4: the Hadamard spreads one non-zero value over all dims; a single Hadamard row
        # pattern concentrates it back on one output dim: z = S * c with c = fp32 1/sqrt(128).
        # amax = 6 * 2^j exactly has mantissa 1.5, which fp32(S) * c cannot produce (see the
        # e2m1 test), so the cases are the nearest reachable values just above and below.
        for j in (0, 3, -2):
            for direction, want_e in ((np.inf, 127 + j + 1), (0.0, 127 + j)):
                z = np.float32(6.0 * 2.0**j)
                S = None
                for _ in range(16):
                    z = np.nextafter(z, np.float32(direction))
                    S = find_hadamard_input(z)
                    if S is not None:
                        break
                assert S is not None
                got, y = run_single_hadamard(device, "fp4_indexer", S, rows=[5, 40])
                exp = encode(y, fmt)
                assert int(exp["scales"][0, 0]) == want_e, (j, z)
                compare_fields(fmt, got, exp, exact=True)


def find_hadamard_input(target):
    """An fp32 S with fp32(S) * fp32(1/sqrt(128)) == target exactly, or None."""
    target = np.float32(target)
    s = np.float32(np.float64(target) / np.float64(HAD_SCALE32))
    cands = [s]
    up = dn = s
    for _ in range(32):
        up = np.nextafter(up, np.float32(np.inf))
        dn = np.nextafter(dn, np.float32(-np.inf))
        cands += [up, dn]
    for c in cands:
        if np.float32(c * HAD_SCALE32) == target:
            return c
    return None


def run_single_hadamard(device, fmt, S, rows, signs=None):
    """Tokens whose Hadamard output is +-S * c on one dim (row index r of H) and 0 elsewhere:
    the pre-Hadamard values are +-H[r] * |S| / 128 (exact), so every butterfly is exact."""
    n = len(rows)
    sgn = torch.ones(n) if signs is None else torch.tensor(signs, dtype=F32)
    mag = abs(float(S)) / 128.0
    w = torch.full((128,), mag, dtype=F32)
    pattern = H128[torch.tensor(rows)].to(F32) * sgn[:, None] * (1.0 if S > 0 else -1.0)
    got = run_crafted(device, fmt, w, pattern)
    z = torch.zeros(n, 128, dtype=F32)
    zval = torch.tensor(np.float32(abs(float(S))) * HAD_SCALE32, dtype=F32)
    for i, r in enumerate(rows):
        z[i, r] = zval * sgn[i] * (1.0 if S > 0 else -1.0)
    return got, z


def test_fp4_e2m1_ties_and_thresholds(device):
    """e2m1 magnitude index = thresholds strictly below |v|: exact ties go to the SMALLER
    magnitude (0.25 -> 0, 1.25 -> 1, 1.75 -> 1.5, 2.5 -> 2, 3.5 -> 3, 5 -> 4), one ulp above
    goes up. v = z * 2^(127-e): z below the 1e-4 amax floor has the fixed scale 2^-15; z >= 1e-4
    sets its own scale (v in (3, 6]). A tie at 0.75 (mantissa 1.5) is not reachable: no fp32
    S has fp32(S * c) with that mantissa, so only its neighbours are tested."""
    checked = 0
    for t in [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0]:
        z0 = np.float32(t * 2.0**-15) if t < 3.0 else np.float32(t)
        for z in (z0, np.nextafter(z0, np.float32(np.inf)), np.nextafter(z0, np.float32(0))):
            S = find_hadamard_input(z)
            if S is None:
                assert z == z0 and t in (0.75, 6.0), (t, z)
                continue
            got, y = run_single_hadamard(device, "fp4_indexer", S, rows=[0, 77, 127], signs=[1, -1, 1])
            exp = encode(y, "fp4_indexer")
            compare_fields("fp4_indexer", got, exp, exact=True)
            nz = exp["nib"][0, 0]
            want = int(torch.bucketize(torch.tensor(t), E2M1_THRESHOLDS))
            if z == z0:
                assert int(nz) == want, (t, int(nz))  # the tie: smaller magnitude
            elif z < z0:
                assert int(nz) == want, (t, int(nz))
            elif t < 6.0:
                assert int(nz) == want + 1, (t, int(nz))
            checked += 1
    assert checked >= 20


def test_fp8_indexer_e4m3_of_arbitrary_fp32(device):
    """fp8_indexer codes = e4m3(z / scale) with an fp32 scale that is no power of two: the
    inputs to the e4m3 conversion carry all 24 significant bits (sticky bits below the
    rounding point). Pre-Hadamard values are few-bit, so the butterflies are exact and the
    kernel's z is fp32(S) * fp32(1/sqrt(128)) with S the exact Hadamard sum (the kernel applies
    the 1/sqrt(128) once, after the butterflies). Also covers the 1e-4 amax floor."""
    gen = torch.Generator().manual_seed(21)
    for call, lo in enumerate([2.0**-27, 2.0**-6, 2.0**-3, 2.0**-12, 2.0**5]):
        ints = torch.randint(1, 2**10, (128,), generator=gen).to(F32)
        w = ints * lo  # 10 significant bits
        signs = torch.where(torch.rand(16, 128, generator=gen) < 0.5, -1.0, 1.0)
        got = run_crafted(device, "fp8_indexer", w, signs, torch.randint(-30, 30, (16,), generator=gen))
        S = (signs.double() * w.double()) @ H128  # exact: integers * lo below 2^24 * lo
        z = S.to(F32) * torch.tensor(HAD_SCALE32)
        exp = encode(z, "fp8_indexer")
        floored = exp["scale"] == torch.tensor(1e-4, dtype=F32) / 448.0
        assert bool(floored.all()) if call == 0 else not bool(floored.any())
        compare_fields("fp8_indexer", got, exp, exact=True)


def test_fp4_indexer_exact_random(device):
    gen = torch.Generator().manual_seed(23)
    ints = torch.randint(1, 2**12, (128,), generator=gen).to(F32)
    w = ints * 2.0**-9
    signs = torch.where(torch.rand(16, 128, generator=gen) < 0.5, -1.0, 1.0)
    got = run_crafted(device, "fp4_indexer", w, signs)
    S = (signs.double() * w.double()) @ H128
    z = S.to(F32) * torch.tensor(HAD_SCALE32)
    compare_fields("fp4_indexer", got, encode(z, "fp4_indexer"), exact=True)


# ---- layout corner cases ----------------------------------------------------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_unaligned_tensors(device, fmt):
    """kv / norm_weight / freqs / cache that start at odd offsets, and a page stride that is
    not a multiple of 8: results equal the aligned ones, nothing else is touched."""
    gen = torch.Generator().manual_seed(31)
    hd, ps, n, max_pos, cr = HEAD_DIM[fmt], 4, 10, 256, 4
    pb = dsv4_ops.cache_page_bytes(fmt, ps) + 3
    pages = 4
    kv = random_kv(n, hd, gen)
    w = torch.rand(hd, generator=gen) + 0.5
    freqs = random_freqs(max_pos, gen)
    locs = torch.randperm(pages * ps, generator=gen)[:n]
    seq = [cr * int(k) for k in torch.randint(1, max_pos // cr, (n,), generator=gen)]
    plan = pack_words(prefill_words(seq, list(range(n))))

    def shifted(t, k=1):
        buf = torch.empty(t.numel() + k, dtype=t.dtype)
        v = buf[k:].view(t.shape)
        v.copy_(t)
        return v

    cache = random_cache(pages, pb - 3, gen, 3)
    ref = store(device, fmt, kv, plan, w, freqs, locs, cache, False, cr, 1e-6, ps)
    # a cache that starts one byte into its storage (and stays so on the device)
    big = torch.cat([torch.zeros(1, dtype=torch.uint8), cache.reshape(-1)]).to(device)
    dev_cache = big[1:].view(cache.shape)
    plan_u = torch.cat([torch.zeros(1, dtype=torch.uint8), plan.reshape(-1)]).to(device)[1:].view(plan.shape)
    kv_u = torch.cat([torch.zeros(1), kv.reshape(-1)]).to(device)[1:].view(kv.shape)
    w_u = torch.cat([torch.zeros(1), w]).to(device)[1:]
    f_u = torch.cat([torch.zeros(1), freqs.reshape(-1)]).to(device)[1:].view(freqs.shape)
    ops.compress_norm_rope_store_op(kv_u, plan_u, w_u, f_u, locs.to(device), dev_cache, False, cr,
                                    1e-6, ps, fmt)
    assert torch.equal(dev_cache.cpu(), ref)
    rows = active_rows(prefill_words(seq, list(range(n))), False, cr, locs.tolist(), max_pos, pages, ps)
    assert len(rows) == n
    y = oracle_y(kv, [p for _, _, p in rows], w, 1e-6, freqs)
    check_cache(fmt, ps, cache, ref, rows, encode(y, fmt))


def test_multidim_cache_view(device):
    """kvcache may have any shape whose dim 0 is the page: page bytes = numel / size(0)."""
    fmt, ps = "fp8_indexer", 64
    gen = torch.Generator().manual_seed(41)
    pb = dsv4_ops.cache_page_bytes(fmt, ps)
    cache = random_cache(3, pb, gen).reshape(3, 66, pb // 66)
    kv = random_kv(4, 128, gen)
    freqs = random_freqs(64, gen)
    words = prefill_words([4, 8, 12, 16], [0, 1, 2, 3])
    locs = torch.tensor([0, 63, 64, 191])
    after = store(device, fmt, kv, pack_words(words), torch.ones(128), freqs, locs, cache, False, 4,
                  1e-6, ps)
    rows = active_rows(words, False, 4, locs.tolist(), 64, 3, ps)
    y = oracle_y(kv, [0, 4, 8, 12], torch.ones(128), 1e-6, freqs)
    check_cache(fmt, ps, cache, after, rows, encode(y, fmt))


def test_empty_inputs(device):
    cache = torch.zeros(2, dsv4_ops.cache_page_bytes("bf16", 1), dtype=torch.uint8)
    after = store(device, "bf16", torch.zeros(0, 512), torch.zeros(0, 16, dtype=torch.uint8),
                  torch.ones(512), torch.zeros(4, 64), torch.zeros(0, dtype=torch.int32), cache,
                  True, 4, 1e-6, 1)
    assert torch.equal(after, cache)
    store(device, "bf16", torch.ones(1, 512), pack_words(decode_words([4], [0])), torch.ones(512),
          torch.zeros(4, 64), torch.zeros(1, dtype=torch.int32),
          torch.zeros(0, dsv4_ops.cache_page_bytes("bf16", 1), dtype=torch.uint8), True, 4, 1e-6, 1)


# ---- the project's plain-PyTorch reference (dsv4_ops.testing.reference) --------------------------

@pytest.mark.parametrize("fmt", FORMATS)
def test_against_dsv4_reference_store(device, fmt):
    from dsv4_ops.testing import reference
    gen = torch.Generator().manual_seed(71)
    hd, ps, n, max_pos, cr = HEAD_DIM[fmt], 64, 40, 1024, 4
    pages = 2
    cache = torch.zeros(pages, dsv4_ops.cache_page_bytes(fmt, ps), dtype=torch.uint8)
    kv = random_kv(n, hd, gen)
    w = torch.rand(hd, generator=gen) + 0.5
    freqs = random_freqs(max_pos, gen)
    pos = torch.randint(0, max_pos // cr - 1, (n,), generator=gen) * cr
    locs = torch.randperm(pages * ps, generator=gen)[:n]
    want = cache.clone()
    reference.store(want, kv, pos, locs, w, 1e-6, freqs, fmt, ps)
    words = prefill_words([int(p) + cr for p in pos], list(range(n)))
    got = store(device, fmt, kv, pack_words(words), w, freqs, locs, cache, False, cr, 1e-6, ps)
    d, s = slot_indices(fmt, ps, cache.shape[1], locs.tolist())
    fg = read_fields(fmt, got.reshape(-1)[d], got.reshape(-1)[s])
    fw = read_fields(fmt, want.reshape(-1)[d], want.reshape(-1)[s])
    compare_fields(fmt, fg, fw)


# ---- the Python layer ---------------------------------------------------------------------

@pytest.mark.parametrize("strided", [False, True], ids=["contiguous", "strided"])
@pytest.mark.parametrize("use_fp4", [False, True])
def test_python_api_complex_freqs(device, use_fp4, strided):
    """dsv4_ops.compress_norm_rope_store: plan objects, complex freq_cis (a contiguous table, read
    through a view, and every other column of a wider one), format from flags."""
    gen = torch.Generator().manual_seed(51)
    hd = 128
    fmt = "fp4_indexer" if use_fp4 else "fp8_indexer"
    ps, n = 64, 6
    ang = torch.rand(300, 64 if strided else 32, generator=gen, dtype=torch.float64) * 6.3
    freq_cis = torch.polar(torch.ones_like(ang), ang).to(torch.complex64)
    dev_freq_cis = freq_cis.to(device)
    if strided:  # (sliced on the device: moving a strided view would make it contiguous)
        freq_cis, dev_freq_cis = freq_cis[:, ::2], dev_freq_cis[:, ::2]
    freqs = torch.view_as_real(freq_cis).flatten(-2)
    words = prefill_words([4 * (k + 1) for k in range(n)], list(range(n)))
    plan = dsv4_ops.CompressorPrefillPlan(4, pack_words(words).to(device),
                                          torch.zeros(0, 8, dtype=torch.uint8, device=device),
                                          torch.zeros(2, dtype=torch.int32))
    kv = random_kv(n, hd, gen)
    w = torch.rand(hd, generator=gen) + 0.5
    cache = random_cache(2, dsv4_ops.cache_page_bytes(fmt, ps), gen)
    dev_cache = cache.to(device)
    locs = torch.tensor([3, 70, 64, 0, 127, 5])
    dsv4_ops.compress_norm_rope_store(kv.to(device), plan, norm_weight=w.to(device), norm_eps=1e-6,
                                      freq_cis=dev_freq_cis, out_loc=locs.to(device),
                                      kvcache=dev_cache, page_size=ps, use_fp4=use_fp4)
    rows = active_rows(words, False, 4, locs.tolist(), 300, 2, ps)
    y = oracle_y(kv, [p for _, _, p in rows], w, 1e-6, freqs)
    check_cache(fmt, ps, cache, dev_cache.cpu(), rows, encode(y, fmt))


# ---- errors -------------------------------------------------------------------------------

def _good_args(fmt="fp8_ds_mla"):
    hd = HEAD_DIM[fmt]
    return dict(kv=torch.zeros(2, hd), plan=pack_words(decode_words([4, 8], [0, 1])),
                norm_weight=torch.ones(hd), freqs=torch.zeros(16, 64), out_loc=torch.zeros(2, dtype=torch.int32),
                kvcache=torch.zeros(2, dsv4_ops.cache_page_bytes(fmt, 1), dtype=torch.uint8), is_decode=True,
                compress_ratio=4, eps=1e-6, page_size=1, store_format=fmt)


def _call(device, a):
    # Moving a view to another device would make it contiguous: keep each tensor's strides.
    t = {k: (v if not isinstance(v, torch.Tensor) or v.device == device
             else torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device=device).copy_(v))
         for k, v in a.items()}
    torch.ops.dsv4.compress_norm_rope_store(t["kv"], t["plan"], t["norm_weight"], t["freqs"], t["out_loc"],
                                            t["kvcache"], t["is_decode"], t["compress_ratio"], t["eps"],
                                            t["page_size"], t["store_format"])


BAD = [
    ("kv", dict(kv=torch.zeros(2, 512, dtype=torch.float16))),
    ("kv", dict(kv=torch.zeros(2, 128))),  # head_dim does not match the format
    ("kv", dict(kv=torch.zeros(2, 512, 2)[..., 0])),  # not contiguous
    ("kv", dict(kv=torch.zeros(1024))),
    ("plan", dict(plan=torch.zeros(3, 16, dtype=torch.uint8))),  # rows != kv rows
    ("plan", dict(plan=torch.zeros(2, 8, dtype=torch.uint8))),
    ("plan", dict(plan=torch.zeros(2, 4, dtype=torch.int32))),
    ("norm_weight", dict(norm_weight=torch.ones(128))),
    ("norm_weight", dict(norm_weight=torch.ones(512, dtype=torch.float64))),
    ("freqs", dict(freqs=torch.zeros(16, 32))),
    ("freqs", dict(freqs=torch.zeros(16, 64, dtype=torch.float64))),
    ("freqs", dict(freqs=torch.zeros(64, 16).t())),
    ("out_loc", dict(out_loc=torch.zeros(2))),
    ("out_loc", dict(out_loc=torch.zeros(2, 1, dtype=torch.int64))),
    ("kvcache", dict(kvcache=torch.zeros(2, 1151, dtype=torch.uint8))),  # page too small
    ("kvcache", dict(kvcache=torch.zeros(2, 1152, dtype=torch.int8))),
    ("kvcache", dict(kvcache=torch.zeros(1152, 2, dtype=torch.uint8).t())),
    ("page_size", dict(page_size=3)),
    ("page_size", dict(page_size=0)),
    ("page_size", dict(page_size=-64)),
    ("store_format", dict(store_format="fp8")),
    ("compress_ratio", dict(compress_ratio=8)),
]


@pytest.mark.parametrize("arg,change", BAD, ids=[f"{a}-{i}" for i, (a, _) in enumerate(BAD)])
def test_bad_arguments(device, arg, change):
    a = _good_args()
    _call(device, a)  # the unchanged call is fine
    a.update(change)
    with pytest.raises(RuntimeError, match=rf"dsv4\.{OP}: {arg}\b"):
        _call(device, a)


def test_bad_page_size_for_indexer(device):
    a = _good_args("fp4_indexer")
    a["page_size"] = 64  # cache has room for page_size 1 only
    with pytest.raises(RuntimeError, match=rf"dsv4\.{OP}: kvcache.*page_size 64"):
        _call(device, a)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("arg", ["kv", "plan", "norm_weight", "freqs", "out_loc"])
def test_cpu_tensor_on_cuda_call(arg):
    a = _good_args()
    t = {k: (v.cuda() if isinstance(v, torch.Tensor) and k != arg else v) for k, v in a.items()}
    with pytest.raises(RuntimeError, match=rf"dsv4\.{OP}: {arg}\b"):
        torch.ops.dsv4.compress_norm_rope_store(*t.values())


# ---- backends agree bit for bit --------------------------------------------------------------

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kv_dt", [torch.float32, torch.bfloat16])
def test_cpu_and_cuda_bit_identical(fmt, kv_dt):
    gen = torch.Generator().manual_seed(61)
    hd, ps, n, max_pos, cr = HEAD_DIM[fmt], 64, 300, 4096, 4
    pages = -(-n // ps) + 1
    cache = random_cache(pages, dsv4_ops.cache_page_bytes(fmt, ps), gen)
    kv = random_kv(n, hd, gen).to(kv_dt)
    w = (torch.rand(hd, generator=gen) + 0.5).to(torch.bfloat16)
    freqs = random_freqs(max_pos, gen)
    seq = [cr * int(k) for k in torch.randint(1, max_pos // cr, (n,), generator=gen)]
    plan = pack_words(prefill_words(seq, list(range(n))))
    locs = torch.randperm(pages * ps, generator=gen)[:n]
    cpu = store("cpu", fmt, kv, plan, w, freqs, locs, cache, False, cr, 1e-6, ps)
    gpu = store("cuda", fmt, kv, plan, w, freqs, locs, cache, False, cr, 1e-6, ps)
    assert torch.equal(cpu, gpu)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_cpu_and_cuda_bit_identical_special_values(fmt, eps):
    """Rows with NaNs (both signs, other payloads), infinities, signed zeros, subnormals and
    values whose squares overflow or underflow: the GPU's hardware conversions (bf16, e4m3) and
    its shortcuts (shared reciprocal of the fp8_indexer scale, exponent from the amax bits)
    give the CPU's bytes for these too. With eps = 0 an all-zero row normalises to NaNs."""
    gen = torch.Generator().manual_seed(67)
    hd, ps, max_pos, cr = HEAD_DIM[fmt], 64, 4096, 4
    rows = [torch.zeros(hd), torch.full((hd,), -0.0)]
    for bits in (0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFBFFFFF, 0x7F800000, 0xFF800000):
        r = random_kv(1, hd, gen)[0]
        r[int(torch.randint(0, hd, (1,), generator=gen))] = bits_to_f32([bits])[0]
        rows.append(r)
    r = random_kv(1, hd, gen)[0]
    r[:2] = bits_to_f32([0x7F800000, 0xFF800000])
    rows.append(r)
    rows.append(random_f32_patterns(hd, gen, 0, 0))  # subnormals (and zeros)
    rows.append(random_f32_patterns(hd, gen, 200, 254))  # squares overflow
    rows.append(random_f32_patterns(hd, gen, 1, 40))  # squares underflow
    r = random_kv(1, hd, gen)[0]
    r[torch.rand(hd, generator=gen) < 0.3] = -0.0
    rows.append(r)
    rows += list(random_kv(8, hd, gen) * torch.logspace(-30, 30, 8)[:, None])
    kv = torch.stack(rows).to(F32)
    n = kv.shape[0]
    pages = -(-n // ps) + 1
    cache = random_cache(pages, dsv4_ops.cache_page_bytes(fmt, ps), gen)
    w = (torch.rand(hd, generator=gen) + 0.5).to(torch.bfloat16)
    freqs = random_freqs(max_pos, gen)
    seq = [cr * int(k) for k in torch.randint(1, max_pos // cr, (n,), generator=gen)]
    plan = pack_words(prefill_words(seq, list(range(n))))
    locs = torch.randperm(pages * ps, generator=gen)[:n]
    for kv_dt in (torch.float32, torch.bfloat16):
        x = kv.to(kv_dt)
        cpu = store("cpu", fmt, x, plan, w, freqs, locs, cache, False, cr, eps, ps)
        gpu = store("cuda", fmt, x, plan, w, freqs, locs, cache, False, cr, eps, ps)
        assert not torch.equal(cpu, cache)  # the rows were written
        assert torch.equal(cpu, gpu)


def test_opcheck(device):
    """Schema, mutation annotation and fake implementation agree with the kernel."""
    a = _good_args("fp8_indexer")
    a["kv"] = torch.randn(2, 128)
    args = tuple(v.to(device) if isinstance(v, torch.Tensor) else v for v in a.values())
    torch.library.opcheck(torch.ops.dsv4.compress_norm_rope_store.default, args,
                          test_utils=("test_schema", "test_faketensor"))
