"""Planner ops (docs/contract.md 2.1, 3.1-3.3, 3.5) against an independent plain-Python oracle.

The oracle below walks requests and positions one by one and writes the expected int32 words
of every record straight from the contract's rules; every planner (CPU, CUDA with host lengths, CUDA
with device lengths) must match it byte for byte."""
import random

import pytest
import torch

import dsv4_ops
from dsv4_ops import ops, window_size
from dsv4_ops.testing import worlds

INV_C = [-1, 0, -1, -1]   # CompressPlan invalid, as int32 words
INV_W = [-1, -1]          # WritePlan invalid


# ---------------------------------------------------------------------------------------------
# Oracle
# ---------------------------------------------------------------------------------------------
class Tables:
    """Python lists of req_to_token / full_to_state plus the addressing parameters."""

    def __init__(self, mode, cr, *, r2t=None, f2s=None, sps=0, ring=0, offset=0):
        self.mode, self.cr, self.sps, self.ring, self.offset = mode, cr, sps, ring, offset
        self.r2t = r2t.tolist() if r2t is not None else None
        self.f2s = f2s.tolist() if f2s is not None else None

    def slot(self, rid, pos):
        """contract 2.1; any lookup outside the tables (or a negative entry) is -1, and so is a slot
        that does not fit the plans' int32 fields."""
        s = self._slot(rid, pos)
        return s if s <= 2 ** 31 - 1 else -1

    def _slot(self, rid, pos):
        if rid < 0:
            return -1
        if self.mode == "online":
            return rid + self.offset
        if pos < 0:
            return -1
        if self.mode == "legacy":
            if self.cr == 4:
                page = 2 * rid + (pos // 4) % 2
                return page * 4 + pos % 4
            return rid * 128 + pos % 128
        if self.mode == "req_ring":
            return rid * self.ring + pos % self.ring
        assert self.mode == "swa"
        if rid >= len(self.r2t) or pos >= len(self.r2t[rid]):
            return -1
        full = self.r2t[rid][pos]
        if full < 0 or full >= len(self.f2s):
            return -1
        swa = self.f2s[full]
        if swa < 0:
            return -1
        return (swa // self.sps) * self.ring + swa % self.ring

    def page(self, slot):
        return -1 if slot < 0 else slot // self.cr


def oracle_decode(t: Tables, rids, seq_lens):
    rows = []
    for rid, sl in zip(rids, seq_lens):
        if sl < 1:
            rows.append([0, -1, -1, -1])
        elif t.mode == "online":
            s = t.slot(rid, sl - 1)
            rows.append([sl, s, s, -1])
        else:
            p1 = sl - 1
            p0 = max(p1 - t.cr, 0)
            wl = t.slot(rid, p1)
            rows.append([sl, wl, t.page(t.slot(rid, p0)), t.page(wl)])
    return rows


def oracle_prefill(t: Tables, rids, seq_lens, extend_lens):
    """Valid CompressPlan rows and WritePlan rows (contract 3.3) as int32 word lists."""
    cr = t.cr
    win = window_size(cr)
    legacy = t.mode == "legacy"
    pad = t.ring - win + 2 if (not legacy and t.ring > win) else 0
    comp, writes = [], []
    ragged0 = 0
    for b, (rid, sl, el) in enumerate(zip(rids, seq_lens, extend_lens)):
        prefix = sl - el
        last_c = (sl // cr) * cr
        first_w = min(last_c - (4 if cr == 4 else 0), sl - pad)
        for j in range(el):
            pos = prefix + j
            ragged = ragged0 + j
            if (pos + 1) % cr == 0:
                buffer_len = win - min(j + 1, win)
                if buffer_len == 0 and not legacy:
                    rp0, rp1 = -1, b
                else:
                    rp0 = t.page(t.slot(rid, max(pos - cr, 0)))
                    rp1 = t.page(t.slot(rid, pos))
                comp.append([pos + 1, ragged | (buffer_len << 16), rp0, rp1])
            in_band = t.mode == "swa" and pos % t.sps >= t.sps - 4
            if pos >= first_w or in_band:
                writes.append([ragged, t.slot(rid, pos)])
        ragged0 += el
    return comp, writes


def oracle_online_prefill(t: Tables, rids, seq_lens, extend_lens):
    """contract 3.5: 128-chunk segments of [prefix, seq_len); closing ones -> plan_c, the trailing
    partial one -> plan_w."""
    comp, partial = [], []
    ragged0 = 0
    for rid, sl, el in zip(rids, seq_lens, extend_lens):
        prefix = sl - el
        a = prefix
        while a < sl:
            e = min(sl, (a // 128 + 1) * 128)
            ragged = ragged0 + (e - 1 - prefix)
            rec = [e, ragged | ((e - a) << 16), t.slot(rid, 0), rid if rid >= 0 else -1]
            (comp if e % 128 == 0 else partial).append(rec)
            a = e
        ragged0 += el
    return comp, partial


def padded(rows, n, invalid):
    return rows + [list(invalid)] * (n - len(rows))


# ---------------------------------------------------------------------------------------------
# Worlds
# ---------------------------------------------------------------------------------------------
NUM_ROWS = 12
MAX_CTX = 1024


def make_tables(gen: torch.Generator, sps: int, neg_frac: float = 0.0, row_pad: int = 16,
                ctx: int = MAX_CTX):
    """req_to_token [NUM_ROWS, ctx] int32 (row stride ctx + row_pad, the padding -7; ctx a
    multiple of sps) of shuffled full pages of sps tokens; full_to_state maps each full page
    onto a shuffled SWA page of 5 spare ones more (page-aligned, so pos % sps == swa % sps), a
    fraction of entries evicted (-1)."""
    r2t, f2s, _, _ = worlds.page_tables(
        gen, num_req_rows=NUM_ROWS, row_lengths={r: ctx for r in range(NUM_ROWS)},
        page_size=sps, swa_page_size=sps, max_context=ctx, row_pad=row_pad, row_fill=-7,
        spare_swa_pages=5, evicted_fraction=neg_frac)
    return r2t, f2s


def random_batch(rng: random.Random, batch: int, cr: int, max_len: int = MAX_CTX):
    rids = rng.sample(range(NUM_ROWS), batch)
    seq_lens, extend_lens = [], []
    for _ in range(batch):
        sl = rng.choice([rng.randint(1, max_len), rng.randint(1, 3 * cr), cr * rng.randint(1, 4)])
        sl = min(sl, max_len)
        kind = rng.random()
        if kind < 0.15:
            el = 0                                   # nothing to extend
        elif kind < 0.4:
            el = sl                                  # no prefix
        elif kind < 0.55:
            el = rng.randint(1, min(3, sl))          # a few tokens (MTP-like)
        else:
            el = rng.randint(0, sl)                  # unaligned prefix
        seq_lens.append(sl)
        extend_lens.append(el)
    return rids, seq_lens, extend_lens


def strided(r2t: torch.Tensor, device, row_pad: int = 16) -> torch.Tensor:
    """req_to_token on `device` with a row stride larger than its row (a column slice)."""
    wide = torch.full((r2t.shape[0], r2t.shape[1] + row_pad), -7, dtype=r2t.dtype, device=device)
    wide[:, : r2t.shape[1]] = r2t.to(device)
    return wide[:, : r2t.shape[1]]


def i64(values, device):
    return torch.tensor(values, dtype=torch.int64, device=device)


def words(plan: torch.Tensor):
    return plan.cpu().contiguous().view(torch.int32).tolist()


def assert_rows(actual: torch.Tensor, expected, what: str):
    got = words(actual)
    assert len(got) == len(expected), f"{what}: {len(got)} rows, expected {len(expected)}"
    for r, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"{what}: row {r} is {g}, expected {e}"


def planner_runs(device):
    """(plan device, lengths device) pairs for one test device: on CPU the host-lengths and the
    'device-lengths' calls are both CPU calls; on CUDA the CPU planner, the CUDA planner with host
    lengths and the CUDA planner with device lengths."""
    cpu = torch.device("cpu")
    if device.type == "cpu":
        return [(cpu, cpu), (cpu, cpu)]
    return [(cpu, cpu), (device, cpu), (device, device)]


def check_prefill_runs(device, call, nq, comp, writes, w_invalid):
    exp_c = padded(comp, nq, INV_C)
    exp_w = padded(writes, nq, w_invalid)
    for plan_dev, len_dev in planner_runs(device):
        pc, pw, counts = call(plan_dev, len_dev)
        what = f"plan on {plan_dev}, lengths on {len_dev}"
        assert pc.device == plan_dev and pw.device == plan_dev, what
        assert counts.device == len_dev and counts.dtype == torch.int32, what
        assert pc.dtype == torch.uint8 and pc.shape == (nq, 16), what
        assert pw.dtype == torch.uint8 and pw.shape == (nq, len(w_invalid) * 4), what
        assert counts.tolist() == [len(comp), len(writes)], what
        assert_rows(pc, exp_c, f"plan_c ({what})")
        assert_rows(pw, exp_w, f"plan_w ({what})")
        # No valid record equals an invalid sentinel (first word 0xFFFFFFFF).
        assert all(r[0] != -1 for r in words(pc)[: len(comp)])
        assert all(r[0] != -1 for r in words(pw)[: len(writes)])


# ---------------------------------------------------------------------------------------------
# Prefill planners
# ---------------------------------------------------------------------------------------------
PAGED_CASES = [
    # (compress_ratio, use_req_ring, swa_page_size, ring_size)
    (4, False, 256, 8),
    (4, False, 64, 8),
    (4, False, 256, 16),
    (4, False, 64, 16),
    (4, True, 64, 8),
    (4, True, 64, 16),
    (128, False, 256, 128),
    (128, False, 64, 256),
    (128, True, 256, 128),
    (128, True, 64, 256),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("cr,req_ring,sps,ring", PAGED_CASES)
def test_plan_prefill_matches_oracle(device, cr, req_ring, sps, ring, seed):
    gen = torch.Generator().manual_seed(seed * 100 + ring + sps)
    rng = random.Random(seed * 7 + cr + ring + sps + int(req_ring))
    r2t, f2s = make_tables(gen, sps, neg_frac=0.05 if seed else 0.0)
    rids, sls, els = random_batch(rng, rng.randint(1, 8), cr)
    nq = sum(els) + rng.choice([0, 1, 37])
    mode = "req_ring" if (req_ring or cr == 128) else "swa"
    t = Tables(mode, cr, r2t=r2t, f2s=f2s, sps=sps, ring=ring)
    comp, writes = oracle_prefill(t, rids, sls, els)

    def call(plan_dev, len_dev):
        return ops.plan_prefill(i64(rids, plan_dev), i64(sls, len_dev), i64(els, len_dev),
                                strided(r2t, plan_dev), f2s.to(plan_dev), cr, sps, ring, nq, req_ring)

    check_prefill_runs(device, call, nq, comp, writes, INV_W)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("cr", [4, 128])
def test_plan_prefill_legacy_matches_oracle(device, cr, seed):
    rng = random.Random(seed * 13 + cr)
    rids, sls, els = random_batch(rng, rng.randint(1, 8), cr)
    nq = sum(els) + rng.choice([0, 5])
    comp, writes = oracle_prefill(Tables("legacy", cr), rids, sls, els)

    def call(plan_dev, len_dev):
        return ops.plan_prefill_legacy(i64(rids, plan_dev), i64(sls, len_dev), i64(els, len_dev),
                                       cr, nq)

    check_prefill_runs(device, call, nq, comp, writes, INV_W)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("offset", [0, 3])
def test_plan_online_prefill_matches_oracle(device, offset, seed):
    rng = random.Random(seed * 17 + offset)
    rids, sls, els = random_batch(rng, rng.randint(1, 8), 128)
    # a few hand-picked requests: chunk-aligned prefix/end, single token closing a chunk
    rids += [NUM_ROWS + 1, NUM_ROWS + 2, NUM_ROWS + 3]
    sls += [256, 129, 384]
    els += [128, 1, 1]
    nq = sum(els) + rng.choice([0, 3])
    comp, partial = oracle_online_prefill(Tables("online", 128, offset=offset), rids, sls, els)

    def call(plan_dev, len_dev):
        return ops.plan_online_prefill(i64(rids, plan_dev), i64(sls, len_dev), i64(els, len_dev),
                                       nq, offset)

    check_prefill_runs(device, call, nq, comp, partial, INV_C)


@pytest.mark.parametrize("ring", [8, 16])
def test_plan_prefill_small_swa_pages(device, ring):
    """Small SWA pages (16 tokens): the band rule (last 4 positions of every page) meets
    prefixes and first_w at every offset of a page."""
    sps = 16
    gen = torch.Generator().manual_seed(ring)
    rng = random.Random(ring)
    r2t, f2s = make_tables(gen, sps, neg_frac=0.02)
    rids = list(range(NUM_ROWS))
    sls = [rng.randint(1, 120) for _ in rids]
    els = [rng.randint(0, sl) for sl in sls]
    nq = sum(els)
    comp, writes = oracle_prefill(Tables("swa", 4, r2t=r2t, f2s=f2s, sps=sps, ring=ring),
                                  rids, sls, els)

    def call(plan_dev, len_dev):
        return ops.plan_prefill(i64(rids, plan_dev), i64(sls, len_dev), i64(els, len_dev),
                                strided(r2t, plan_dev), f2s.to(plan_dev), 4, sps, ring, nq, False)

    check_prefill_runs(device, call, nq, comp, writes, INV_W)


def test_prefill_hand_example(device):
    """A small case written out by hand (contract 3.3): SWA-paged cr=4, sps=64, ring=8, identity
    tables; request 0 at row 0 (sl=10, no prefix), request 1 at row 1 (sl=5, prefix 2)."""
    r2t = torch.arange(200, dtype=torch.int32).view(2, 100)
    f2s = torch.arange(200)
    pc, pw, counts = ops.plan_prefill(i64([0, 1], device), i64([10, 5], "cpu"),
                                      i64([10, 3], "cpu"), r2t.to(device), f2s.to(device),
                                      4, 64, 8, 14, False)
    assert counts.tolist() == [3, 9]
    # swa(row 1, pos p) = 100 + p -> slot (100 // 64) * 8 + (100 + p) % 8 = 12 + p
    assert words(pc)[:4] == [[4, 3 | (4 << 16), 0, 0],      # pos 3, j=3: 4 rows from the state
                             [8, 7, -1, 0],                  # pos 7, j=7: none; rp1 = batch 0
                             [4, 11 | (6 << 16), 3, 3],      # row 1 pos 3 (j=1): slots 12, 15
                             INV_C]
    # request 0: first_w = min(8 - 4, 10) = 4; request 1: first_w = min(4 - 4, 5) = 0
    assert words(pw)[:10] == [[4, 4], [5, 5], [6, 6], [7, 7], [8, 0], [9, 1],
                              [10, 14], [11, 15], [12, 8], INV_W]


def test_prefill_band_rule(device):
    """SWA-paged cr=4: the last 4 positions of every SWA page are persisted even far before
    first_w; the request ring has no such band."""
    sps = 16
    r2t, f2s = make_tables(torch.Generator().manual_seed(5), sps)
    rids, sls, els = [3], [100], [100]
    for req_ring, expect_band in [(False, True), (True, False)]:
        pc, pw, counts = ops.plan_prefill(i64(rids, device), i64(sls, "cpu"), i64(els, "cpu"),
                                          r2t.to(device), f2s.to(device), 4, sps, 8, 100,
                                          req_ring)
        ragged = [r[0] for r in words(pw)[: int(counts[1])]]
        band = [q for p in range(12, 96, sps) for q in range(p, p + 4)]  # 12..15, 28..31, ...
        tail = list(range(96, 100))  # first_w = min(100 - 4, 100) = 96
        assert ragged == (sorted(set(band + tail)) if expect_band else tail)


def test_prefill_negative_full_to_state(device):
    """Evicted tokens (full_to_state < 0): -1 write_loc and -1 read pages, never page 0."""
    r2t, f2s = make_tables(torch.Generator().manual_seed(9), 64)
    rid, sl, el = 2, 40, 30  # prefix 10
    row = r2t[rid].tolist()
    for pos in (11, 36, 37):
        f2s[row[pos]] = -1
    pc, pw, counts = ops.plan_prefill(i64([rid], device), i64([sl], "cpu"), i64([el], "cpu"),
                                      strided(r2t, device), f2s.to(device), 4, 64, 8, el, False)
    comp = {r[0] - 1: r for r in words(pc)[: int(counts[0])]}
    assert comp[11][1] >> 16 == 6                      # j = 1: 6 rows from the state
    assert comp[11][2] != -1 and comp[11][3] == -1     # rp1 = page of pos 11 (evicted)
    assert comp[15][1] >> 16 == 2                      # j = 5: 2 rows from the state
    assert comp[15][2] == -1 and comp[15][3] != -1     # rp0 = page of pos 11 (evicted)
    wr = {r[0] + 10: r[1] for r in words(pw)[: int(counts[1])]}
    assert wr[36] == -1 and wr[37] == -1 and wr[38] != -1


# Ring and SWA page sizes that are not powers of two: the planners divide by them with a
# multiply and a shift computed on the host (plan_math.h, Divisor).
ODD_CASES = [
    # (compress_ratio, use_req_ring, swa_page_size, ring_size)
    (4, False, 24, 12),
    (4, False, 60, 20),
    (4, True, 36, 12),
    (128, False, 1152, 384),
    (128, True, 384, 640),
]


@pytest.mark.parametrize("cr,req_ring,sps,ring", ODD_CASES)
def test_plan_odd_ring_and_page_sizes(device, cr, req_ring, sps, ring):
    ctx = -(-MAX_CTX // sps) * sps
    gen = torch.Generator().manual_seed(ring + sps)
    rng = random.Random(ring * 3 + sps)
    r2t, f2s = make_tables(gen, sps, neg_frac=0.05, ctx=ctx)
    mode = "req_ring" if (req_ring or cr == 128) else "swa"
    t = Tables(mode, cr, r2t=r2t, f2s=f2s, sps=sps, ring=ring)
    rids, sls, els = random_batch(rng, 8, cr, max_len=ctx)
    nq = sum(els) + 5
    comp, writes = oracle_prefill(t, rids, sls, els)

    def call(plan_dev, len_dev):
        return ops.plan_prefill(i64(rids, plan_dev), i64(sls, len_dev), i64(els, len_dev),
                                strided(r2t, plan_dev), f2s.to(plan_dev), cr, sps, ring, nq, req_ring)

    check_prefill_runs(device, call, nq, comp, writes, INV_W)
    dec_rids = [rng.randrange(NUM_ROWS) for _ in range(16)]
    dec_sls = [rng.randint(1, ctx) for _ in range(12)] + [sps, sps + 1, ring, ring + 1]
    exp = oracle_decode(t, dec_rids, dec_sls)
    for dev in {torch.device("cpu"), device}:
        plan = ops.plan_decode(i64(dec_rids, dev), strided(r2t, dev), f2s.to(dev),
                               i64(dec_sls, dev), cr, sps, ring, req_ring)
        assert_rows(plan, exp, f"plan_decode on {dev}")


@pytest.mark.parametrize("cr,ring", [(4, 12), (4, 1000004), (4, 2 ** 30 + 4), (128, 384)])
def test_plan_request_ring_near_int32_positions(device, cr, ring):
    """Positions up to 2^31 - 2 (the largest seq_len a planner takes is 2^31 - 1) with request
    rings that are not powers of two, decode and prefill."""
    sls = [2 ** 31 - 1, 2 ** 31 - 2, 2 ** 31 - 13, 3 * 2 ** 29 + 7, 12345678, ring, ring + 1]
    rids = [0 if ring > 2 ** 20 else i % 5 for i in range(len(sls))]  # slots fit int32
    t = Tables("req_ring", cr, ring=ring)
    r2t = torch.zeros((NUM_ROWS, 4), dtype=torch.int32)
    f2s = torch.zeros(1, dtype=torch.int64)
    exp = oracle_decode(t, rids, sls)
    for dev in {torch.device("cpu"), device}:
        plan = ops.plan_decode(i64(rids, dev), r2t.to(dev), f2s.to(dev), i64(sls, dev), cr, 64,
                               ring, True)
        assert_rows(plan, exp, f"plan_decode on {dev}")
    els = [3, 1, cr + 2, 0, 2 * cr, 5, 1]
    nq = sum(els)
    comp, writes = oracle_prefill(t, rids, sls, els)
    assert comp and writes

    def call(plan_dev, len_dev):
        return ops.plan_prefill(i64(rids, plan_dev), i64(sls, len_dev), i64(els, len_dev),
                                r2t.to(plan_dev), f2s.to(plan_dev), cr, 64, ring, nq, True)

    check_prefill_runs(device, call, nq, comp, writes, INV_W)


def test_plan_slots_past_int32(device):
    """full_to_state entries at and past 2^31 (the planners' 64-bit path: slots that fit int32
    and slots that do not, which are -1) and request rows whose ring slots pass 2^31 - 1."""
    sps, ring, ctx = 64, 8, 256
    bases = [0, 2 ** 31 - sps, 2 ** 31, 2 ** 33, 2 ** 40, 2 ** 62]
    r2t = torch.arange(NUM_ROWS * ctx, dtype=torch.int32).view(NUM_ROWS, ctx)
    f2s = torch.tensor([bases[(i // sps) % len(bases)] + i % sps for i in range(NUM_ROWS * ctx)])
    t = Tables("swa", 4, r2t=r2t, f2s=f2s, sps=sps, ring=ring)
    rng = random.Random(31)
    rids = [rng.randrange(NUM_ROWS) for _ in range(24)]
    sls = [rng.randint(1, ctx) for _ in rids]
    exp = oracle_decode(t, rids, sls)
    slots = {r[1] for r in exp}
    assert -1 in slots and max(slots) > 2 ** 30  # both kinds of large entry occur
    for dev in {torch.device("cpu"), device}:
        plan = ops.plan_decode(i64(rids, dev), r2t.to(dev), f2s.to(dev), i64(sls, dev), 4, sps,
                               ring, False)
        assert_rows(plan, exp, f"plan_decode on {dev}")
    els = [min(sl, rng.randint(1, 40)) for sl in sls]
    nq = sum(els)
    comp, writes = oracle_prefill(t, rids, sls, els)

    def call(plan_dev, len_dev):
        return ops.plan_prefill(i64(rids, plan_dev), i64(sls, len_dev), i64(els, len_dev),
                                r2t.to(plan_dev), f2s.to(plan_dev), 4, sps, ring, nq, False)

    check_prefill_runs(device, call, nq, comp, writes, INV_W)
    # request ring of 8: row 2^28 - 1 has the last slots below 2^31, rows from 2^28 none
    rids, sls = [2 ** 28 - 1, 2 ** 28, 2 ** 31 - 1, 3], [13, 13, 6, 9]
    t = Tables("req_ring", 4, ring=ring)
    exp = oracle_decode(t, rids, sls)
    assert [r[1] for r in exp] == [2 ** 31 - 4, -1, -1, 3 * 8 + 0]
    for dev in {torch.device("cpu"), device}:
        plan = ops.plan_decode(i64(rids, dev), r2t.to(dev), f2s.to(dev), i64(sls, dev), 4, sps,
                               ring, True)
        assert_rows(plan, exp, f"plan_decode (request ring) on {dev}")


# ---------------------------------------------------------------------------------------------
# Decode planners
# ---------------------------------------------------------------------------------------------
def decode_lengths(rng, cr, batch):
    fixed = [1, 2, cr - 1, cr, cr + 1, 2 * cr, 8, 9]
    return [rng.choice(fixed + [rng.randint(1, MAX_CTX)]) for _ in range(batch)]


@pytest.mark.parametrize("cr,req_ring,sps,ring", PAGED_CASES)
def test_plan_decode_matches_oracle(device, cr, req_ring, sps, ring):
    gen = torch.Generator().manual_seed(ring + sps)
    rng = random.Random(cr + ring + sps + int(req_ring))
    r2t, f2s = make_tables(gen, sps, neg_frac=0.05)
    rids = [rng.randrange(NUM_ROWS) for _ in range(10)]
    sls = decode_lengths(rng, cr, 10)
    mode = "req_ring" if (req_ring or cr == 128) else "swa"
    exp = oracle_decode(Tables(mode, cr, r2t=r2t, f2s=f2s, sps=sps, ring=ring), rids, sls)
    for dev in {torch.device("cpu"), device}:
        plan = ops.plan_decode(i64(rids, dev), strided(r2t, dev), f2s.to(dev), i64(sls, dev), cr,
                               sps, ring, req_ring)
        assert plan.device == dev and plan.dtype == torch.uint8 and plan.shape == (10, 16)
        assert_rows(plan, exp, f"plan_decode on {dev}")
        wrapped = dsv4_ops.CompressorDecodePlan.generate(
            cr, i64(rids, dev).to(torch.int32), r2t.to(dev), f2s.to(dev),
            i64(sls, dev).to(torch.int32), sps, ring, use_req_ring=req_ring)
        assert wrapped.compress_ratio == cr and wrapped.is_decode
        assert torch.equal(wrapped.plan_d, plan)


@pytest.mark.parametrize("cr", [4, 128])
def test_plan_decode_legacy_matches_oracle(device, cr):
    rng = random.Random(cr)
    rids = [rng.randrange(NUM_ROWS) for _ in range(12)]
    sls = decode_lengths(rng, cr, 12)
    exp = oracle_decode(Tables("legacy", cr), rids, sls)
    for dev in {torch.device("cpu"), device}:
        plan = ops.plan_decode_legacy(i64(rids, dev), i64(sls, dev), cr)
        assert_rows(plan, exp, f"plan_decode_legacy on {dev}")
        wrapped = dsv4_ops.CompressorDecodePlan.generate_legacy(cr, i64(rids, dev), i64(sls, dev))
        assert torch.equal(wrapped.plan_d, plan)
    if cr == 4:  # first window (seq_len 4): both pages are the current page (contract 3.4)
        plan = ops.plan_decode_legacy(i64([5], device), i64([4], device), 4)
        assert words(plan) == [[4, 5 * 8 + 3, 10, 10]]


@pytest.mark.parametrize("offset", [0, 3])
def test_plan_online_decode_matches_oracle(device, offset):
    rng = random.Random(offset)
    rids = [rng.randrange(NUM_ROWS) for _ in range(9)]
    sls = decode_lengths(rng, 128, 9)
    exp = oracle_decode(Tables("online", 128, offset=offset), rids, sls)
    r2t = torch.zeros((NUM_ROWS, 4), dtype=torch.int32)
    for dev in {torch.device("cpu"), device}:
        plan = ops.plan_online_decode(i64(rids, dev), i64(sls, dev), offset)
        assert_rows(plan, exp, f"plan_online_decode on {dev}")
        wrapped = dsv4_ops.CompressorDecodePlan.generate_online(
            i64(sls, dev), i64(rids, dev), r2t.to(dev), state_slot_offset=offset)
        assert wrapped.compress_ratio == 128 and torch.equal(wrapped.plan_d, plan)


def test_decode_empty_batch(device):
    r2t, f2s = make_tables(torch.Generator().manual_seed(0), 64)
    e = i64([], device)
    assert ops.plan_decode(e, r2t.to(device), f2s.to(device), e, 4, 64, 8).shape == (0, 16)
    assert ops.plan_decode_legacy(e, e, 128).shape == (0, 16)
    assert ops.plan_online_decode(e, e, 1).shape == (0, 16)


# ---------------------------------------------------------------------------------------------
# Out-of-range lookups never read out of bounds: slot / page -1
# ---------------------------------------------------------------------------------------------
def test_out_of_range_lookups_are_absent(device):
    sps, ring = 64, 8
    r2t, f2s = make_tables(torch.Generator().manual_seed(3), sps)
    r2t = r2t[:4, :200]                      # 4 rows, max_ctx 200
    r2t[1, 5:9] = -3                         # negative full locations
    r2t[1, 9:13] = 10 ** 6                   # full locations beyond full_to_state
    t = Tables("swa", 4, r2t=r2t, f2s=f2s, sps=sps, ring=ring)
    rids = [1, 7, -2, 3]                     # row 7 >= rows of req_to_token, -2 < 0
    sls = [20, 12, 9, 230]                   # 230 > max_ctx
    els = [20, 12, 9, 40]
    exp_d = oracle_decode(t, rids, sls)
    assert exp_d[1] == [12, -1, -1, -1] and exp_d[3][1] == -1
    for dev in {torch.device("cpu"), device}:
        plan = ops.plan_decode(i64(rids, dev), r2t.to(dev), f2s.to(dev), i64(sls, dev), 4, sps,
                               ring, False)
        assert_rows(plan, exp_d, f"plan_decode on {dev}")
    comp, writes = oracle_prefill(t, rids, sls, els)
    nq = sum(els)

    def call(plan_dev, len_dev):
        return ops.plan_prefill(i64(rids, plan_dev), i64(sls, len_dev), i64(els, len_dev),
                                strided(r2t, plan_dev), f2s.to(plan_dev), 4, sps, ring, nq, False)

    check_prefill_runs(device, call, nq, comp, writes, INV_W)
    # negative request rows in the ring / online / legacy planners
    for dev in {torch.device("cpu"), device}:
        assert words(ops.plan_online_decode(i64([-1], dev), i64([5], dev), 2)) == [[5, -1, -1, -1]]
        assert words(ops.plan_decode_legacy(i64([-1], dev), i64([5], dev), 4)) == [[5, -1, -1, -1]]
        # a decode seq_len of 0 has no token
        assert words(ops.plan_decode_legacy(i64([2], dev), i64([0], dev), 4)) == [[0, -1, -1, -1]]


# ---------------------------------------------------------------------------------------------
# Limits, padding, sentinels
# ---------------------------------------------------------------------------------------------
def test_num_q_tokens_limit(device):
    rids, sls, els = [0, 1], [40000, 30000], [36000, 29536]   # 65536 tokens
    comp, writes = oracle_prefill(Tables("req_ring", 4, ring=8), rids, sls, els)
    pc, pw, counts = ops.plan_prefill(i64(rids, device), i64(sls, "cpu"), i64(els, "cpu"),
                                      torch.zeros((2, 1), dtype=torch.int32, device=device),
                                      torch.zeros(1, dtype=torch.int64, device=device),
                                      4, 64, 8, 65536, True)
    assert counts.tolist() == [len(comp), len(writes)]
    assert words(pc) == comp + [INV_C] * (65536 - len(comp))
    assert words(pw) == writes + [INV_W] * (65536 - len(writes))
    assert max(r[1] & 0xFFFF for r in comp) == 65535
    with pytest.raises(RuntimeError, match=r"dsv4\.plan_prefill: num_q_tokens"):
        ops.plan_prefill(i64(rids, device), i64(sls, "cpu"), i64(els, "cpu"),
                         torch.zeros((2, 1), dtype=torch.int32, device=device),
                         torch.zeros(1, dtype=torch.int64, device=device), 4, 64, 8, 65537, True)
    with pytest.raises(RuntimeError, match=r"dsv4\.plan_prefill_legacy: num_q_tokens"):
        ops.plan_prefill_legacy(i64([0], device), i64([1], "cpu"), i64([1], "cpu"), 4, 65537)
    with pytest.raises(RuntimeError, match=r"dsv4\.plan_online_prefill: num_q_tokens"):
        ops.plan_online_prefill(i64([0], device), i64([1], "cpu"), i64([1], "cpu"), 65537, 0)


def test_batch_limit(device):
    big = torch.zeros(65536, dtype=torch.int64)
    r2t = torch.zeros((1, 4), dtype=torch.int32, device=device)
    f2s = torch.zeros(4, dtype=torch.int64, device=device)
    for lengths_dev in {torch.device("cpu"), device}:
        z = big.to(lengths_dev)
        with pytest.raises(RuntimeError, match=r"dsv4\.plan_prefill: req_pool_indices.*65535"):
            ops.plan_prefill(big.to(device), z, z, r2t, f2s, 4, 64, 8, 16, False)
        with pytest.raises(RuntimeError, match=r"dsv4\.plan_prefill_legacy: req_pool_indices"):
            ops.plan_prefill_legacy(big.to(device), z, z, 128, 16)
        with pytest.raises(RuntimeError, match=r"dsv4\.plan_online_prefill: req_pool_indices"):
            ops.plan_online_prefill(big.to(device), z, z, 16, 0)
    # 65535 requests are fine (all empty: every row invalid)
    z = big[:65535]
    for lengths_dev in {torch.device("cpu"), device}:
        pc, pw, counts = ops.plan_online_prefill(z.to(device), z.to(lengths_dev),
                                                 z.to(lengths_dev), 3, 0)
        assert counts.tolist() == [0, 0]
        assert words(pc) == [INV_C] * 3 and words(pw) == [INV_C] * 3


@pytest.mark.parametrize("B", [63, 64, 1023, 1024, 3000])
def test_large_batch_scan(device, B):
    """Many requests (the device scan splits them over threads): same bytes as the oracle.
    The sizes straddle the GPU glue's paths: offsets in the kernel parameters (host lengths,
    B < 64), one fused kernel (device lengths, B < 1024), separate scan and emission."""
    rng = random.Random(11 + B)
    rids = [rng.randrange(NUM_ROWS) for _ in range(B)]
    sls = [rng.randint(0, 300) for _ in range(B)]
    els = [rng.choice([0, 0, 1, 2, min(s, 9)]) if s else 0 for s in sls]
    els = [min(e, s) for e, s in zip(els, sls)]
    nq = sum(els) + 10
    for cr in (4, 128):
        comp, writes = oracle_prefill(Tables("legacy", cr), rids, sls, els)

        def call(plan_dev, len_dev):
            return ops.plan_prefill_legacy(i64(rids, plan_dev), i64(sls, len_dev),
                                           i64(els, len_dev), cr, nq)

        check_prefill_runs(device, call, nq, comp, writes, INV_W)


def test_empty_prefill(device):
    for plan_dev, len_dev in planner_runs(device):
        pc, pw, counts = ops.plan_prefill_legacy(i64([], plan_dev), i64([], len_dev),
                                                 i64([], len_dev), 4, 4)
        assert counts.tolist() == [0, 0] and words(pc) == [INV_C] * 4 and words(pw) == [INV_W] * 4
        pc, pw, counts = ops.plan_online_prefill(i64([3], plan_dev), i64([7], len_dev),
                                                 i64([0], len_dev), 0, 0)
        assert pc.shape == (0, 16) and pw.shape == (0, 16) and counts.tolist() == [0, 0]


# ---------------------------------------------------------------------------------------------
# Bad lengths: clear errors with host lengths; clamped (never out of bounds) on the device
# ---------------------------------------------------------------------------------------------
BAD_LENGTHS = [
    ("extend_lens", [5, 3], [6, 1], 10),        # extend_len > seq_len
    ("extend_lens", [5, 3], [-1, 1], 10),       # negative extend_len
    ("seq_lens", [-2, 3], [0, 1], 10),          # negative seq_len
    ("seq_lens", [2 ** 31, 3], [1, 1], 10),     # seq_len >= 2^31
    ("num_q_tokens", [5, 3], [5, 3], 7),        # more tokens than num_q_tokens
]


@pytest.mark.parametrize("arg,sls,els,nq", BAD_LENGTHS)
def test_bad_host_lengths(device, arg, sls, els, nq):
    def check(op, fn):
        with pytest.raises(RuntimeError) as info:
            fn()
        assert f"dsv4.{op}" in str(info.value) and arg in str(info.value), str(info.value)

    rids = i64([0, 1], device)
    S, E = i64(sls, "cpu"), i64(els, "cpu")
    r2t, f2s = make_tables(torch.Generator().manual_seed(0), 64)
    check("plan_prefill", lambda: ops.plan_prefill(rids, S, E, r2t.to(device), f2s.to(device),
                                                   4, 64, 8, nq, False))
    check("plan_prefill_legacy", lambda: ops.plan_prefill_legacy(rids, S, E, 128, nq))
    check("plan_online_prefill", lambda: ops.plan_online_prefill(rids, S, E, nq, 0))


def test_bad_device_lengths_are_clamped(device):
    """Device lengths cannot be validated without a sync: the GPU planner clamps them
    (0 <= el <= sl < 2^31, tokens past num_q_tokens dropped) and stays in bounds."""
    if device.type != "cuda":
        pytest.skip("device lengths are host lengths on the CPU")
    sls = [5, 9, -4, 300, 40]
    els = [7, 4, 3, 200, -2]
    nq = 120
    # clamped: el -> [5, 4, 0, 200, 0], tokens cut at 120: [5, 4, 0, 111, 0]
    c_sls, c_els = [5, 9, 0, 300, 40], [5, 4, 0, 111, 0]
    for cr in (4, 128):
        comp, writes = oracle_prefill(Tables("legacy", cr), [0, 1, 2, 3, 4], c_sls, c_els)
        pc, pw, counts = ops.plan_prefill_legacy(i64(range(5), device), i64(sls, device),
                                                 i64(els, device), cr, nq)
        assert counts.tolist() == [len(comp), len(writes)]
        assert_rows(pc, padded(comp, nq, INV_C), "plan_c")
        assert_rows(pw, padded(writes, nq, INV_W), "plan_w")


# ---------------------------------------------------------------------------------------------
# Argument errors
# ---------------------------------------------------------------------------------------------
def _raises(op, arg, fn):
    with pytest.raises(RuntimeError) as info:
        fn()
    msg = str(info.value)
    assert f"dsv4.{op}:" in msg and arg in msg, msg


def test_addressing_errors(device):
    r2t, f2s = make_tables(torch.Generator().manual_seed(0), 64)
    r2t, f2s = r2t.to(device), f2s.to(device)
    rid, sl, el = i64([0], device), i64([4], "cpu"), i64([4], "cpu")
    sld = i64([4], device)

    def prefill(cr, sps, ring, req_ring, **kw):
        a = dict(req_to_token=r2t, full_to_state=f2s)
        a.update(kw)
        return lambda: ops.plan_prefill(rid, sl, el, a["req_to_token"], a["full_to_state"], cr,
                                        sps, ring, 8, req_ring)

    def decode(cr, sps, ring, req_ring):
        return lambda: ops.plan_decode(rid, r2t, f2s, sld, cr, sps, ring, req_ring)

    for make, op in ((prefill, "plan_prefill"), (decode, "plan_decode")):
        _raises(op, "compress_ratio", make(8, 64, 8, False))
        _raises(op, "ring_size", make(4, 64, 6, False))      # ring % cr != 0
        _raises(op, "ring_size", make(4, 64, 0, False))
        _raises(op, "swa_page_size", make(4, 60, 8, False))  # sps % ring != 0
        _raises(op, "swa_page_size", make(4, 0, 8, False))
        _raises(op, "ring_size", make(4, 64, 4, True))       # request ring < window
        _raises(op, "ring_size", make(128, 256, 64, False))  # cr = 128 is a request ring
    _raises("plan_prefill", "req_to_token",
            prefill(4, 64, 8, False, req_to_token=r2t.t()))  # column stride != 1
    _raises("plan_prefill", "full_to_state",
            prefill(4, 64, 8, False, full_to_state=f2s.view(-1, 2)))
    _raises("plan_prefill", "full_to_state",
            prefill(4, 64, 8, False, full_to_state=f2s[::2]))
    _raises("plan_prefill", "extend_lens",
            lambda: ops.plan_prefill(rid, sl, i64([4, 4], "cpu"), r2t, f2s, 4, 64, 8, 8, False))
    _raises("plan_prefill_legacy", "compress_ratio",
            lambda: ops.plan_prefill_legacy(rid, sl, el, 64, 8))
    _raises("plan_decode_legacy", "seq_lens",
            lambda: ops.plan_decode_legacy(rid, i64([4, 5], device), 4))
    _raises("plan_online_decode", "state_slot_offset",
            lambda: ops.plan_online_decode(rid, sld, -1))
    _raises("plan_online_prefill", "req_pool_indices",
            lambda: ops.plan_online_prefill(rid.to(torch.int32), sl, el, 8, 0))
    # cr = 128 and use_req_ring ignore full_to_state entirely
    ops.plan_prefill(rid, sl, el, r2t, torch.zeros(0, device=device), 128, 0, 128, 8, False)
    ops.plan_decode(rid, r2t, torch.zeros(0, device=device), sld, 4, 0, 8, True)


def test_device_mismatch_errors(device):
    if device.type != "cuda":
        pytest.skip("needs a second device type")
    r2t, f2s = make_tables(torch.Generator().manual_seed(0), 64)
    rid = i64([0], device)
    _raises("plan_decode", "seq_lens",
            lambda: ops.plan_decode(rid, r2t.to(device), f2s.to(device), i64([4], "cpu"), 4, 64,
                                    8, False))
    _raises("plan_decode_legacy", "seq_lens",
            lambda: ops.plan_decode_legacy(rid, i64([4], "cpu"), 4))
    _raises("plan_prefill", "req_to_token",
            lambda: ops.plan_prefill(rid, i64([4], "cpu"), i64([4], "cpu"), r2t, f2s.to(device),
                                     4, 64, 8, 8, False))
    _raises("plan_prefill", "full_to_state",
            lambda: ops.plan_prefill(rid, i64([4], "cpu"), i64([4], "cpu"), r2t.to(device), f2s,
                                     4, 64, 8, 8, False))
    _raises("plan_prefill_legacy", "extend_lens",
            lambda: ops.plan_prefill_legacy(rid, i64([4], "cpu"), i64([4], device), 4, 8))
    _raises("plan_online_prefill", "seq_lens",
            lambda: ops.plan_online_prefill(i64([0], "cpu"), i64([4], device), i64([4], device),
                                            8, 0))


# ---------------------------------------------------------------------------------------------
# Plan classes: trimming, CUDA-graph padding, copy_
# ---------------------------------------------------------------------------------------------
def test_prefill_plan_trim_and_copy(device):
    r2t, f2s = make_tables(torch.Generator().manual_seed(1), 64)
    r2t, f2s = r2t.to(device), f2s.to(device)
    rids, sls, els = [4, 7], [30, 17], [30, 6]
    comp, writes = oracle_prefill(Tables("swa", 4, r2t=r2t.cpu(), f2s=f2s.cpu(), sps=64, ring=8),
                                  rids, sls, els)

    def gen(lengths_dev, nq, graph, s=sls, e=els, r=rids):
        return dsv4_ops.CompressorPrefillPlan.generate(
            4, i64(r, device).to(torch.int32), torch.tensor(s, dtype=torch.int32, device=lengths_dev),
            torch.tensor(e, dtype=torch.int32, device=lengths_dev), r2t, f2s, 64, 8, nq,
            use_cuda_graph=graph)

    trimmed = gen("cpu", 40, False)
    assert not trimmed.is_decode and trimmed.compress_ratio == 4
    assert words(trimmed.plan_c) == comp and words(trimmed.plan_w) == writes
    full = gen("cpu", 40, True)
    assert full.plan_c.shape == (40, 16) and full.plan_w.shape == (40, 8)
    assert words(full.plan_c) == padded(comp, 40, INV_C)
    if device.type == "cuda":   # device lengths: counts unknown on the host, never trimmed
        dev_plan = gen(device, 40, False)
        assert dev_plan.plan_c.shape == (40, 16) and dev_plan.counts.device == device

    # copy_ a fresh, trimmed plan of another batch into the padded (graph) plan
    r2, s2, e2 = [1], [9], [9]
    c2, w2 = oracle_prefill(Tables("swa", 4, r2t=r2t.cpu(), f2s=f2s.cpu(), sps=64, ring=8),
                            r2, s2, e2)
    fresh = gen("cpu", 9, False, s2, e2, r2)
    full.copy_(fresh)
    assert words(full.plan_c) == padded(c2, 40, INV_C)
    assert words(full.plan_w) == padded(w2, 40, INV_W)
    assert full.counts.tolist() == [len(c2), len(w2)]
    with pytest.raises(ValueError):
        fresh.copy_(full)   # more rows than the destination holds

    # legacy and online wrappers trim the same way
    leg = dsv4_ops.CompressorPrefillPlan.generate_legacy(128, i64(rids, "cpu"), i64([300, 17], "cpu"),
                                                         i64([300, 6], "cpu"), 306, device)
    assert leg.plan_c.shape[0] == 2 and leg.plan_c.device == device
    onl = dsv4_ops.CompressorPrefillPlan.generate_online(
        i64([300, 17], "cpu"), i64([300, 6], "cpu"), i64(rids, "cpu"), r2t, 306,
        use_cuda_graph=False, state_slot_offset=2)
    c3, w3 = oracle_online_prefill(Tables("online", 128, offset=2), rids, [300, 17], [300, 6])
    assert words(onl.plan_c) == c3 and words(onl.plan_w) == w3
    onl_g = dsv4_ops.CompressorPrefillPlan.generate_online(
        i64([300, 17], "cpu"), i64([300, 6], "cpu"), i64(rids, "cpu"), r2t, 310,
        use_cuda_graph=True, state_slot_offset=2)
    assert words(onl_g.plan_w) == padded(w3, 310, INV_C)
    onl_g.copy_(onl)
    assert words(onl_g.plan_w) == padded(w3, 310, INV_C)
