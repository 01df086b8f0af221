"""compress_forward (docs/contract.md 3.4, 3.5) against a float64 oracle.

Plans are built here by a small independent Python planner that follows the contract's rules
(3.1-3.3, 3.5) with request-ring addressing whose pages are scattered by a random permutation
(as SWA paging scatters them), so these tests do not depend on the planner ops. Sequences are
fed the way an engine feeds them (prefill from scratch, unaligned extends, decode steps); every
compressed token is compared with the pooled value of the whole sequence, every state row with
the exact bytes it must hold, and every row no plan addresses must stay untouched.
"""
import struct

import pytest
import torch

import dsv4_ops  # noqa: F401  (registers torch.ops.dsv4)
from dsv4_ops import kv_score_row_width, window_size
from dsv4_ops.spec import ONLINE_TOKEN_FOLD_MAX
from dsv4_ops.testing import reference

# ---------------------------------------------------------------------------------------------
# the float64 oracle (contract 1.2 / 3.5): dsv4_ops.testing.reference, whole sequences, no plans
# ---------------------------------------------------------------------------------------------
OP = torch.ops.dsv4.compress_forward
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
NEG = -torch.finfo(torch.float32).max


def ref_tokens(kv_score, ape, cr, hd):
    """Every compressed token of one request's kv_score rows (the oracle, float64, host)."""
    return reference.compressed_tokens(kv_score.cpu(), ape.cpu(), cr, hd).double()


def ref_online_state(kv_score, ape, hd):
    return tuple(t.double() for t in reference.online_state(kv_score.cpu(), ape.cpu(), hd))


def pool64(kv, score, ape, present):
    """Softmax pool of explicit rows [n, hd] (float64); absent rows get weight 0."""
    kv, z = kv.double().cpu(), score.double().cpu() + ape.double().cpu()
    p = torch.as_tensor(present, dtype=torch.bool)
    if not bool(p.any()):
        return torch.zeros(kv.shape[1], dtype=torch.float64)
    return (torch.softmax(z[p], dim=0) * kv[p]).sum(0)


# ---------------------------------------------------------------------------------------------
# plan records (contract 3.1), packed with struct so the layout is checked independently
# ---------------------------------------------------------------------------------------------
INVALID_C = (0xFFFFFFFF, 0, 0, -1, -1)
INVALID_W = (0xFFFFFFFF, -1)


def pack(fmt, size, records, n_rows=None, invalid=None):
    n_rows = len(records) if n_rows is None else n_rows
    recs = list(records) + [invalid] * (n_rows - len(records))
    if not recs:
        return torch.empty(0, size, dtype=torch.uint8)
    buf = bytearray(b"".join(struct.pack(fmt, *r) for r in recs))
    return torch.frombuffer(buf, dtype=torch.uint8).view(-1, size).clone()


def pack_decode(records):  # (seq_len, write_loc, read_page_0, read_page_1)
    return pack("<Iiii", 16, records)


def pack_compress(records, n_rows=None):  # (seq_len, ragged_id, buffer_len, rp0, rp1)
    return pack("<IHHii", 16, records, n_rows, INVALID_C)


def pack_write(records, n_rows=None):  # (ragged_id, write_loc)
    return pack("<Ii", 8, records, n_rows, INVALID_W)


class Addr:
    """Request-ring slots (slot = rid*ring + pos%ring) with the ring pages scattered over a
    larger pool by a random permutation; the spare pages are never addressed."""

    def __init__(self, cr, ring, n_req, gen, spare_pages=3):
        self.cr, self.ring = cr, ring
        n_log = n_req * (ring // cr)
        self.num_pages = n_log + spare_pages
        self.perm = torch.randperm(self.num_pages, generator=gen)[:n_log].tolist()

    def slot(self, rid, pos):
        rs = rid * self.ring + pos % self.ring
        return self.perm[rs // self.cr] * self.cr + rs % self.cr


def plan_decode(addr, cr, reqs):
    """contract 3.2; reqs: (rid, seq_len)."""
    recs = []
    for rid, s in reqs:
        p1 = s - 1
        p0 = max(p1 - cr, 0)
        wl = addr.slot(rid, p1)
        recs.append((s, wl, addr.slot(rid, p0) // cr, wl // cr))
    return recs


def plan_prefill(addr, cr, reqs):
    """contract 3.3 (request ring: no band rule); reqs: (rid, seq_len, extend_len).
    Returns (compress records, their rids, write records)."""
    win = window_size(cr)
    pad = addr.ring - win + 2 if addr.ring > win else 0
    C, rids, W = [], [], []
    base = 0
    for b, (rid, sl, el) in enumerate(reqs):
        prefix = sl - el
        last_c = (sl // cr) * cr
        first_w = min(last_c - (4 if cr == 4 else 0), sl - pad)
        for j in range(el):
            pos, rag = prefix + j, base + j
            if (pos + 1) % cr == 0:
                bl = win - min(j + 1, win)
                if bl > 0:
                    rp0, rp1 = addr.slot(rid, max(pos - cr, 0)) // cr, addr.slot(rid, pos) // cr
                else:
                    rp0, rp1 = -1, b
                C.append((pos + 1, rag, bl, rp0, rp1))
                rids.append(rid)
            if pos >= first_w:
                W.append((rag, addr.slot(rid, pos)))
        base += el
    return C, rids, W


def plan_online_prefill(reqs, off):
    """contract 3.5; reqs: (rid, seq_len, extend_len). Returns (plan_c recs, their rids, plan_w recs,
    their rids)."""
    C, crids, W, wrids = [], [], [], []
    base = 0
    for rid, sl, el in reqs:
        prefix = sl - el
        a = prefix
        while a < sl:
            e = min((a // 128 + 1) * 128, sl)
            rec = (e, base + (e - 1 - prefix), e - a, rid + off, rid)
            if e % 128 == 0:
                C.append(rec)
                crids.append(rid)
            else:
                W.append(rec)
                wrids.append(rid)
            a = e
        base += el
    return C, crids, W, wrids


# ---------------------------------------------------------------------------------------------
# comparison helpers
# ---------------------------------------------------------------------------------------------
def bits(t):
    t = t.detach().cpu().contiguous()
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def assert_bits_equal(a, b, what):
    ba, bb = bits(a), bits(b)
    if not torch.equal(ba, bb):
        bad = (ba != bb).reshape(ba.shape[0], -1).any(1).nonzero().flatten().tolist()
        raise AssertionError(f"{what}: rows differ bitwise: {bad[:20]}")


def out_tol(odt):
    return (1e-5, 1e-6) if odt == F32 else (2.0 ** -8, 1e-5)


def assert_rows_close(got, ref, odt, what, rtol=None, atol=None):
    r, a = out_tol(odt)
    rtol = r if rtol is None else rtol
    atol = a if atol is None else atol
    g = got.detach().double().cpu()
    assert torch.isfinite(g).all(), f"{what}: non-finite output"
    err = (g - ref).abs()
    lim = atol + rtol * ref.abs()
    if not bool((err <= lim).all()):
        i = int(((err - lim) / lim).argmax())
        raise AssertionError(f"{what}: max violation at flat {i}: got {g.flatten()[i]}, "
                             f"ref {ref.flatten()[i]}, max abs err {float(err.max()):.3e}")


def random_rows(gen, n, cr, hd, exact_bf16):
    x = torch.randn(n, kv_score_row_width(cr, hd), generator=gen)
    # scores a little wider than kv so the softmax is not flat
    sc = slice(2 * hd, 4 * hd) if cr == 4 else slice(hd, 2 * hd)
    x[:, sc] *= 2.0
    return x.to(BF16).float() if exact_bf16 else x


# ---------------------------------------------------------------------------------------------
# offline engine simulation
# ---------------------------------------------------------------------------------------------
class OfflineSim:
    def __init__(self, device, cr, hd, sdt=F32, idt=F32, odt=F32, adt=F32, ring=None,
                 n_req=4, max_len=64, seed=0):
        self.dev, self.cr, self.hd = device, cr, hd
        self.sdt, self.idt, self.odt = sdt, idt, odt
        self.row = kv_score_row_width(cr, hd)
        gen = torch.Generator().manual_seed(seed)
        # bf16 anywhere: make every value bf16-exact so state stores are lossless and the
        # oracle sees exactly what the kernel sees
        exact = BF16 in (sdt, idt)
        self.X = [random_rows(gen, max_len, cr, hd, exact) for _ in range(n_req)]
        self.ape = (torch.randn(window_size(cr), hd, generator=gen) * 0.5).to(adt)
        self.ape_dev = self.ape.to(device)
        self.ref = [ref_tokens(x, self.ape, cr, hd) for x in self.X]
        ring = ring if ring is not None else window_size(cr)
        self.addr = Addr(cr, ring, n_req, gen)
        garbage = torch.randn(self.addr.num_pages, cr, self.row, generator=gen).to(sdt)
        self.state = garbage.to(device)
        self.exp_state = garbage.clone()
        self.len = [0] * n_req
        self.tokens_checked = 0

    def _run(self, inp, plan, plan_w, n_out):
        out = torch.full((n_out, self.hd), float("nan"), dtype=self.odt, device=self.dev)
        OP(self.state, inp.to(self.idt).to(self.dev), self.ape_dev, plan.to(self.dev),
           None if plan_w is None else plan_w.to(self.dev), out, self.hd, self.cr, False)
        return out.cpu()

    def prefill(self, items, pad=False):
        """items: (rid, extend_len). pad: plans padded to num_q_tokens with invalid records."""
        reqs = [(rid, self.len[rid] + el, el) for rid, el in items]
        C, rids, W = plan_prefill(self.addr, self.cr, reqs)
        inp = torch.cat([self.X[rid][self.len[rid]:self.len[rid] + el] for rid, el in items])
        T = inp.shape[0]
        n_c = T if pad else len(C)
        plan_c = pack_compress(C, n_c)
        plan_w = pack_write(W, T if pad else len(W))
        out = self._run(inp, plan_c, plan_w, n_c)
        for k, (rec, rid) in enumerate(zip(C, rids)):
            assert_rows_close(out[k], self.ref[rid][rec[0] // self.cr - 1], self.odt,
                              f"prefill token rid={rid} s={rec[0]} bl={rec[2]}")
            self.tokens_checked += 1
        assert bool((out[len(C):] == 0).all()), "invalid plan rows must be zeros"
        flat = self.exp_state.view(-1, self.row)
        for rag, slot in W:
            flat[slot] = inp[rag].to(self.idt).to(self.sdt)
        assert_bits_equal(self.state.view(-1, self.row), flat, "state after prefill")
        for rid, el in items:
            self.len[rid] += el

    def decode(self, rids):
        reqs = [(rid, self.len[rid] + 1) for rid in rids]
        recs = plan_decode(self.addr, self.cr, reqs)
        inp = torch.stack([self.X[rid][self.len[rid]] for rid in rids])
        out = self._run(inp, pack_decode(recs), None, len(rids))
        for b, (rid, s) in enumerate(reqs):
            if s % self.cr == 0:
                assert_rows_close(out[b], self.ref[rid][s // self.cr - 1], self.odt,
                                  f"decode token rid={rid} s={s}")
                self.tokens_checked += 1
            else:
                assert bool((out[b] == 0).all()), f"decode row {b} (s={s}) closes no window: zeros"
        flat = self.exp_state.view(-1, self.row)
        for b, rec in enumerate(recs):
            flat[rec[1]] = inp[b].to(self.idt).to(self.sdt)
        assert_bits_equal(self.state.view(-1, self.row), flat, "state after decode")
        for rid in rids:
            self.len[rid] += 1


def run_offline_scenario(sim, cr):
    if cr == 4:
        sim.prefill([(2, 13), (0, 4), (3, 1)])            # from scratch, unaligned
        sim.prefill([(2, 9), (0, 7), (3, 2)], pad=True)   # extends reading the state
        for _ in range(6):
            sim.decode([0, 2, 3])
        sim.prefill([(3, 5), (2, 17), (0, 1)])
        for _ in range(5):
            sim.decode([3, 0, 2])
        sim.prefill([(1, 4)])                             # exactly the first window
    else:
        sim.prefill([(2, 200), (0, 128), (3, 5)])
        sim.prefill([(2, 100), (0, 3), (3, 122)], pad=True)
        for _ in range(4):
            sim.decode([0, 2, 3])
        sim.prefill([(3, 9), (2, 86), (0, 121)])          # rid 0 closes 256 with 7 state rows
        sim.decode([2, 3, 0])
    assert sim.tokens_checked > 0


def test_padded_prefill_many_records(device):
    """cr = 128 prefill with padded plans of over a thousand records, most of them invalid (the
    num_q-row plans of CUDA-graph capture): every valid record pools as the reference says,
    every invalid row is zeros, and the state rows are written. Large enough (over 16 waves
    of one-record blocks on an H200) to cover a GPU launch that gives a block several
    records."""
    sim = OfflineSim(device, 128, 512, max_len=1400, seed=11)
    sim.prefill([(2, 900), (0, 300), (3, 5)], pad=True)
    sim.prefill([(2, 260), (0, 700)], pad=True)
    sim.decode([0, 2, 3])
    assert sim.tokens_checked > 0


@pytest.mark.parametrize("cr,tokens", [(4, 17000), (128, 34000)])
def test_padded_prefill_strided_blocks(device, cr, tokens):
    """A padded prefill long enough that on an H200 a pooling block takes several records in
    turn, strided by the grid, with valid records past the first stride (more valid records
    than the grid has blocks: over 4224 for cr 4, 264 for cr 128, hd 512): those pool in a
    block's later turns, after the barrier between records (cr 128)."""
    sim = OfflineSim(device, cr, 512, n_req=2, max_len=tokens + 600, seed=cr)
    sim.prefill([(1, tokens), (0, 600)], pad=True)
    assert sim.tokens_checked == tokens // cr + 600 // cr


DTYPE_COMBOS = [(s, i, o) for s in (F32, BF16) for i in (F32, BF16) for o in (F32, BF16)]


@pytest.mark.parametrize("cr", [4, 128])
@pytest.mark.parametrize("hd", [128, 512])
@pytest.mark.parametrize("sdt,idt,odt", DTYPE_COMBOS,
                         ids=[f"s{str(s)[6:]}-i{str(i)[6:]}-o{str(o)[6:]}" for s, i, o in DTYPE_COMBOS])
def test_offline_sequences(device, cr, hd, sdt, idt, odt):
    max_len = 64 if cr == 4 else 400
    sim = OfflineSim(device, cr, hd, sdt, idt, odt, max_len=max_len, seed=cr + hd)
    run_offline_scenario(sim, cr)


@pytest.mark.parametrize("cr,ring", [(4, 16), (128, 256)])
def test_offline_sequences_speculative_ring(device, cr, ring):
    # larger rings (speculative decoding): the write rule keeps `pad` more rows
    sim = OfflineSim(device, cr, 128, ring=ring, max_len=64 if cr == 4 else 400, seed=7)
    run_offline_scenario(sim, cr)


@pytest.mark.parametrize("adt", [BF16, F16])
@pytest.mark.parametrize("cr", [4, 128])
def test_ape_dtypes(device, cr, adt):
    sim = OfflineSim(device, cr, 128, adt=adt, max_len=64 if cr == 4 else 400, seed=11)
    run_offline_scenario(sim, cr)


def test_prefill_long_single_request(device):
    # many windows from one extend, all read from the input, two requests
    sim = OfflineSim(device, 4, 512, max_len=300, seed=3)
    sim.prefill([(1, 257), (0, 30)])
    sim.prefill([(1, 3), (0, 6)])


# ---------------------------------------------------------------------------------------------
# offline special rules
# ---------------------------------------------------------------------------------------------
def _state(device, pages, cr, hd, dt=F32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(pages, cr, kv_score_row_width(cr, hd), generator=g).to(dt).to(device)


def _ape(cr, hd, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(window_size(cr), hd, generator=g) * 0.5


def _quarters(cr, hd, r):
    """(kv slice, score slice) of window row r."""
    if cr == 128:
        return slice(0, hd), slice(hd, 2 * hd)
    return (slice(0, hd), slice(2 * hd, 3 * hd)) if r < 4 else (slice(hd, 2 * hd), slice(3 * hd, 4 * hd))


def _pool_rows(cr, hd, rows, ape, present):
    """rows: list of full kv_score rows (or None) of window rows 0..win-1."""
    kv = torch.zeros(len(rows), hd, dtype=torch.float64)
    sc = torch.zeros(len(rows), hd, dtype=torch.float64)
    for r, x in enumerate(rows):
        if x is not None:
            ks, ss = _quarters(cr, hd, r)
            kv[r], sc[r] = x[ks].double(), x[ss].double()
    return pool64(kv, sc, ape, present)


def test_decode_first_window_ignores_overlap_rows(device):
    """cr = 4, seq_len == 4: rows 0..3 are absent and page read_page_0 (= the current page)
    must not be read for them: NaN overlap quarters must not leak into the output."""
    cr, hd = 4, 128
    st = _state(device, 3, cr, hd)
    st[1, :, :hd] = float("nan")             # kv_ovl of the whole page
    st[1, :, 2 * hd:3 * hd] = float("nan")   # score_ovl
    ape = _ape(cr, hd)
    g = torch.Generator().manual_seed(5)
    new = torch.randn(1, 4 * hd, generator=g)
    plan = pack_decode([(4, 1 * 4 + 3, 1, 1)])
    out = torch.full((1, hd), float("nan"), device=device)
    before = st.clone()
    OP(st, new.to(device), ape.to(device), plan.to(device), None, out, hd, cr, False)
    rows = [None] * 4 + [before[1, 0].cpu(), before[1, 1].cpu(), before[1, 2].cpu(), new[0]]
    ref = _pool_rows(cr, hd, rows, ape, [False] * 4 + [True] * 4)
    assert_rows_close(out[0], ref, F32, "first window decode")
    exp = before.cpu().clone()
    exp[1, 3] = new[0]
    assert_bits_equal(st.view(-1, 4 * hd), exp.view(-1, 4 * hd), "state")


def test_prefill_first_window_ignores_state_rows(device):
    """Prefill record s = 4 with buffer_len 4 (pages real): rows 0..3 absent whatever the
    source rule says."""
    cr, hd = 4, 128
    st = _state(device, 2, cr, hd)
    st[0] = float("nan")
    ape = _ape(cr, hd)
    g = torch.Generator().manual_seed(6)
    inp = torch.randn(4, 4 * hd, generator=g)
    plan_c = pack_compress([(4, 3, 4, 0, 0)])
    plan_w = pack_write([])
    out = torch.full((1, hd), float("nan"), device=device)
    OP(st, inp.to(device), ape.to(device), plan_c.to(device), plan_w.to(device), out, hd, cr, False)
    rows = [None] * 4 + [inp[i] for i in range(4)]
    ref = _pool_rows(cr, hd, rows, ape, [False] * 4 + [True] * 4)
    assert_rows_close(out[0], ref, F32, "first window prefill")


@pytest.mark.parametrize("cr", [4, 128])
def test_decode_uses_state_rounded_new_row(device, cr):
    """bf16 state, fp32 input that bf16 cannot hold: the just-written row enters the window
    as its bf16 value (the state is the source), and the state gets the RNE bytes."""
    hd = 128
    st = _state(device, 4, cr, hd, BF16, seed=2)
    ape = _ape(cr, hd)
    g = torch.Generator().manual_seed(8)
    new = torch.randn(1, kv_score_row_width(cr, hd), generator=g) * 1.001
    page = 2
    wl = page * cr + cr - 1
    plan = pack_decode([(cr * 5, wl, 1, page)])
    out = torch.full((1, hd), float("nan"), device=device)
    before = st.clone().cpu()
    OP(st, new.to(device), ape.to(device), plan.to(device), None, out, hd, cr, False)
    exp = before.clone()
    exp.view(-1, kv_score_row_width(cr, hd))[wl] = new[0].to(BF16)
    assert_bits_equal(st.view(-1, kv_score_row_width(cr, hd)), exp.view(-1, kv_score_row_width(cr, hd)), "state")
    flat = exp.view(-1, kv_score_row_width(cr, hd)).float()
    if cr == 4:
        rows = [flat[1 * 4 + i] for i in range(4)] + [flat[page * 4 + i] for i in range(4)]
    else:
        rows = [flat[page * 128 + i] for i in range(128)]
    ref = _pool_rows(cr, hd, rows, ape, [True] * window_size(cr))
    assert_rows_close(out[0], ref, F32, "decode with rounded row")


def _check_mixed_decode_batch(device, cr, hd, batch, sdt=F32, idt=F32,
                              kind_of=lambda b: (b * 7) % 4):
    """One decode call over `batch` events that mixes steps that close a window, steps that close
    none, steps whose write_loc is another row of the window (that row enters as the new
    token's, rounded to the state dtype) and steps that write nothing (kind_of(b): by default
    every kind in every group of four); state rows and outputs are checked against the
    reference."""
    row = kv_score_row_width(cr, hd)
    g = torch.Generator().manual_seed(21)
    pages = (2 if cr == 4 else 1) * batch + 3  # every event reads and writes pages of its own
    st = _state(device, pages, cr, hd, sdt, seed=4)
    ape = _ape(cr, hd)
    inp = torch.randn(batch, row, generator=g).to(idt)
    perm = torch.randperm(pages, generator=g).tolist()
    recs, closing = [], []
    for b in range(batch):
        kind = kind_of(b)  # 0: closes, 1: no window, 2: closes, write_loc mid-window, 3: no write
        p1 = perm[b]
        p0 = perm[batch + b] if cr == 4 else p1
        s = cr * (3 + b % 5) + (1 + b % (cr - 1) if kind in (1, 3) else 0)
        wl = {0: p1 * cr + cr - 1, 1: p1 * cr + (s - 1) % cr, 2: p1 * cr + (b % (cr - 1)), 3: -1}[kind]
        recs.append((s, wl, p0, p1))
        closing.append(kind in (0, 2))
    before = st.clone().cpu()
    out = torch.full((batch, hd), float("nan"), device=device)
    OP(st, inp.to(device), ape.to(device), pack_decode(recs).to(device), None, out, hd, cr, False)
    exp = before.clone().view(-1, row)
    for b, (s, wl, p0, p1) in enumerate(recs):
        if wl >= 0:
            exp[wl] = inp[b].to(sdt)
    assert_bits_equal(st.view(-1, row), exp, "state")
    exp = exp.float()
    out = out.cpu()
    for b, (s, wl, p0, p1) in enumerate(recs):
        if not closing[b]:
            assert bool((out[b] == 0).all()), f"event {b} closes no window: zeros"
            continue
        if cr == 4:
            rows = [exp[p0 * 4 + i] for i in range(4)] + [exp[p1 * 4 + i] for i in range(4)]
        else:
            rows = [exp[p1 * 128 + i] for i in range(128)]
        ref = _pool_rows(cr, hd, rows, ape, [True] * window_size(cr))
        assert_rows_close(out[b], ref, F32, f"event {b} s={s} write_loc={wl}")


@pytest.mark.parametrize("cr,batch", [(4, 600), (128, 300)])
def test_decode_big_batch_mixed_steps(device, cr, batch):
    _check_mixed_decode_batch(device, cr, 128, batch)


def _c128_decode_layout(device, hd):
    """(first batch of the grouped cr = 128 decode blocks, request groups) on `device`, as
    c128_decode_groups computes them: two 512-thread blocks per multiprocessor, hd / 64 slices."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    slices, slots = hd // 64, 2 * sms
    return -(-4 * slots // slices), max(1, slots // slices)


@pytest.mark.parametrize("sdt,idt", [(F32, F32), (BF16, F32), (F32, BF16)],
                         ids=["sf32-if32", "sbf16-if32", "sf32-ibf16"])
@pytest.mark.parametrize("hd,case", [(128, "below"), (128, "at"), (512, "below"), (512, "at"),
                                     (512, "many")])
def test_c128_decode_request_groups(device, hd, case, sdt, idt):
    """cr = 128 decode on the GPU: below 4 waves of blocks a block per request and channel
    slice; from there (c128_decode_groups) a block per slice and group of requests,
    which copies its requests' rows and pools its share of the step's closing requests, the
    new row read from the input. A batch just below and at that threshold, and one of more
    than 32 requests per block (past the rows copied with the plan records), steps of every
    kind; the mixed state / input dtypes read the new row through their own loads."""
    threshold, groups = _c128_decode_layout(device, hd)
    batch = {"below": threshold - 1, "at": threshold, "many": 32 * groups + 1}[case]
    _check_mixed_decode_batch(device, 128, hd, batch, sdt, idt)


def test_c128_decode_copy_rounds(device):
    """A grouped cr = 128 decode block copies the rows of its first 32 requests with their plan
    records and the rest in rounds of 4 rows per thread (32 requests per round): a batch of 97
    requests per block, two full rounds after the first and one partial."""
    _, groups = _c128_decode_layout(device, 512)
    _check_mixed_decode_batch(device, 128, 512, 96 * groups + 5)


def test_c128_decode_uneven_closings(device):
    """The grouped cr = 128 decode ranks the step's closing requests in rounds of 1024 plan
    records (two chunks of 512): closing requests bunched across a chunk and a round boundary,
    a few scattered ones and none elsewhere, so that the chunks' counts differ widely and every
    block's share comes from another part of the step."""
    threshold, _ = _c128_decode_layout(device, 128)
    batch = max(threshold, 2100)

    def kind_of(b):
        if 900 <= b < 1100 or b % 331 == 0 or b >= batch - 2:
            return 2 if b % 3 == 1 else 0
        return 3 if b % 5 == 0 else 1

    _check_mixed_decode_batch(device, 128, 128, batch, kind_of=kind_of)


@pytest.mark.parametrize("cr", [4, 128])
def test_negative_and_out_of_range_are_skipped(device, cr):
    hd = 128
    row = kv_score_row_width(cr, hd)
    pages = 3
    st = _state(device, pages, cr, hd, seed=4)
    before = st.clone().cpu()
    ape = _ape(cr, hd)
    g = torch.Generator().manual_seed(9)
    win = window_size(cr)
    # decode: write_loc -1 / past the buffer, pages -1 / past the buffer -> nothing written,
    # absent rows -> zeros
    inp = torch.randn(3, row, generator=g)
    plan = pack_decode([(2 * cr, -1, -1, -1), (3 * cr, pages * cr, pages, pages + 5),
                        (3 * cr, pages * cr + 7, -1, 1)])
    out = torch.full((3, hd), float("nan"), device=device)
    OP(st, inp.to(device), ape.to(device), plan.to(device), None, out, hd, cr, False)
    assert bool((out[:2] == 0).all())
    flat = before.view(-1, row)
    if cr == 4:  # rows 0..3 from page -1 are absent, rows 4..7 from page 1
        rows = [None] * 4 + [flat[4 + i] for i in range(4)]
        ref = _pool_rows(cr, hd, rows, ape, [False] * 4 + [True] * 4)
    else:
        ref = _pool_rows(cr, hd, [flat[128 + i] for i in range(128)], ape, [True] * 128)
    assert_rows_close(out[2], ref, F32, "half-absent decode window")
    assert_bits_equal(st.view(-1, row), flat, "state untouched")

    # prefill: state pages -1 / out of range and ragged rows before the input are absent;
    # write records with negative / out-of-range slots or ragged ids are skipped
    T = win + 2
    inp = torch.randn(T, row, generator=g)
    bl = 5 if cr == 4 else 70
    recs = [(3 * cr, win - 3, bl, -1, -1),          # state rows absent, rows 0..1 before input
            (3 * cr, T - 1, bl, pages, 99),         # pages past the buffer
            (3 * cr, T + 4, 0, -1, 0)]              # ragged rows past the input (partly)
    plan_c = pack_compress(recs)
    plan_w = pack_write([(0, -1), (1, pages * cr), (T + 3, 0), (2, 5)])
    out = torch.full((3, hd), float("nan"), device=device)
    OP(st, inp.to(device), ape.to(device), plan_c.to(device), plan_w.to(device), out, hd, cr, False)
    for k, (s, rag, b_l, _, _) in enumerate(recs):
        rows, present = [], []
        for r in range(win):
            src = rag - (win - 1) + r
            ok = r >= b_l and 0 <= src < T
            rows.append(inp[src] if ok else None)
            present.append(ok)
        ref = _pool_rows(cr, hd, rows, ape, present)
        assert_rows_close(out[k], ref, F32, f"prefill record {k}")
    exp = flat.clone()
    exp[5] = inp[2]
    assert_bits_equal(st.view(-1, row), exp, "only the valid write landed")


@pytest.mark.parametrize("cr", [4, 128])
def test_prefill_compress_reads_before_writes(device, cr):
    """A write of this batch lands in a slot a compress of the same batch reads from the state:
    the compress must see the old row."""
    hd = 128
    row = kv_score_row_width(cr, hd)
    st = _state(device, 2, cr, hd, seed=12)
    before = st.clone().cpu()
    ape = _ape(cr, hd)
    g = torch.Generator().manual_seed(13)
    win = window_size(cr)
    T = win
    inp = torch.randn(T, row, generator=g)
    bl = 4 if cr == 4 else 64
    plan_c = pack_compress([(2 * cr, T - 1, bl, 1, 1)])
    # overwrite every state row the record reads (page 1) with input rows
    plan_w = pack_write([(i % T, cr + i) for i in range(cr)])
    out = torch.full((1, hd), float("nan"), device=device)
    OP(st, inp.to(device), ape.to(device), plan_c.to(device), plan_w.to(device), out, hd, cr, False)
    flat = before.view(-1, row)
    rows = []
    for r in range(win):
        if r < bl:
            rows.append(flat[cr + (r % 4 if cr == 4 else r)])
        else:
            rows.append(inp[T - 1 - (win - 1) + r])
    ref = _pool_rows(cr, hd, rows, ape, [True] * win)
    assert_rows_close(out[0], ref, F32, "compress before write")
    exp = flat.clone()
    for i in range(cr):
        exp[cr + i] = inp[i % T]
    assert_bits_equal(st.view(-1, row), exp, "writes")


@pytest.mark.parametrize("cr", [4, 128])
def test_minus_inf_logits_weigh_zero(device, cr):
    """Rows whose score is -inf weigh 0 (softmax's rule next to finite rows); channels whose
    rows are all -inf pool to 0 (the README's decision: softmax itself gives NaN there)."""
    hd = 128
    win, row = window_size(cr), kv_score_row_width(cr, hd)
    g = torch.Generator().manual_seed(31)
    inp = torch.randn(2 * win, row, generator=g)
    ape = _ape(cr, hd)
    for r in range(win):
        _, ss = _quarters(cr, hd, r)
        if r % 2:
            inp[r, ss] = float("-inf")                        # window 0: odd rows
        inp[win + r, ss][:32] = float("-inf")                 # window 1: all rows, channels < 32
        if r % 3 == 0:
            inp[win + r, ss][32:] = float("-inf")             # and every third row elsewhere
    plan_c = pack_compress([(2 * win, win - 1, 0, -1, -1), (2 * win, 2 * win - 1, 0, -1, -1)])
    out = torch.full((2, hd), float("nan"), device=device)
    OP(_state(device, 2, cr, hd), inp.to(device), ape.to(device), plan_c.to(device),
       pack_write([]).to(device), out, hd, cr, False)
    for k in range(2):
        ref = _pool_rows(cr, hd, [inp[k * win + r] for r in range(win)], ape, [True] * win)
        if k == 1:
            assert torch.isnan(ref[:32]).all()  # what softmax says there
            ref[:32] = 0.0
        assert_rows_close(out[k], ref, F32, f"window {k}")


@pytest.mark.parametrize("cr", [4, 128])
def test_prefill_many_row_writes(device, cr):
    """More valid plan_w records than the GPU's write groups (2048), invalid records mixed in,
    then padding: every valid row lands, nothing else changes."""
    hd = 128
    row = kv_score_row_width(cr, hd)
    n_valid, T = 5000, 9000
    pages = (2 * n_valid + cr - 1) // cr
    st = _state(device, pages, cr, hd, seed=21)
    flat = st.clone().cpu().view(-1, row)
    g = torch.Generator().manual_seed(22)
    inp = torch.randn(T, row, generator=g)
    slots = torch.randperm(pages * cr, generator=g)[:n_valid].tolist()
    recs = []
    for i, slot in enumerate(slots):
        recs.append((i + 7, slot))
        if i % 5 == 0:
            recs.append(INVALID_W)
    plan_w = pack_write(recs, T)
    plan_c = pack_compress([(2 * window_size(cr), window_size(cr) - 1, 0, -1, -1)])
    out = torch.empty((1, hd), device=device)
    OP(st, inp.to(device), _ape(cr, hd).to(device), plan_c.to(device), plan_w.to(device), out,
       hd, cr, False)
    exp = flat.clone()
    for i, slot in enumerate(slots):
        exp[slot] = inp[i + 7]
    assert_bits_equal(st.view(-1, row), exp, "state after the writes")


def test_empty_plans(device):
    cr, hd = 4, 128
    st = _state(device, 2, cr, hd)
    before = st.clone()
    out = torch.empty((0, hd), device=device)
    OP(st, torch.empty(0, 4 * hd, device=device), _ape(cr, hd).to(device),
       pack_compress([]).to(device), pack_write([]).to(device), out, hd, cr, False)
    OP(st, torch.empty(0, 4 * hd, device=device), _ape(cr, hd).to(device),
       pack_decode([]).to(device), None, out, hd, cr, False)
    assert torch.equal(st, before)


# ---------------------------------------------------------------------------------------------
# online (cr = 128 running state)
# ---------------------------------------------------------------------------------------------
def online_step64(prev, kv, sc, ape_rows):
    """float64 running state (m, S, K) of tokens kv/sc [n, hd] (ape rows by chunk offset),
    merged after the stored state `prev` = (m, S, K) when given (contract 3.5)."""
    z = sc.double() + ape_rows.double()
    m2 = z.max(0).values
    e = torch.exp(z - m2)
    s2, a2 = e.sum(0), (e * kv.double()).sum(0)
    if prev is None:
        return m2, s2, a2 / s2
    m1, S1, K1 = (t.double() for t in prev)
    M = torch.maximum(m1, m2)
    s1p, s2p = S1 * torch.exp(m1 - M), s2 * torch.exp(m2 - M)
    S = s1p + s2p
    return M, S, (K1 * s1p + a2 * torch.exp(m2 - M)) / S


class OnlineSim:
    """Checks every step twice: against a step-local float64 oracle that starts from the state
    the kernel stored before the step (tight for every state dtype: a bf16 state re-enters
    later merges rounded), and, for an fp32 state, against the whole-sequence oracle."""

    def __init__(self, device, hd, sdt=F32, idt=F32, odt=F32, n_req=4, max_len=400, off=0, seed=0):
        self.dev, self.hd, self.sdt, self.idt, self.odt, self.off = device, hd, sdt, idt, odt, off
        gen = torch.Generator().manual_seed(seed)
        exact = idt == BF16
        self.X = [random_rows(gen, max_len, 128, hd, exact) for _ in range(n_req)]
        self.ape = torch.randn(128, hd, generator=gen) * 0.5
        self.ape_dev = self.ape.to(device)
        self.ref = [ref_tokens(x, self.ape, 128, hd) for x in self.X]
        self.n_slots = n_req + off + 2
        garbage = torch.randn(self.n_slots, 1, 3 * hd, generator=gen).to(sdt)
        self.state = garbage.to(device)
        self.prev = garbage.clone()
        self.len = [0] * n_req
        self.tokens_checked = 0

    def _run(self, inp, plan, plan_w, n_out):
        out = torch.full((n_out, self.hd), float("nan"), dtype=self.odt, device=self.dev)
        OP(self.state, inp.to(self.idt).to(self.dev), self.ape_dev, plan.to(self.dev),
           None if plan_w is None else plan_w.to(self.dev), out, self.hd, 128, True)
        return out.cpu()

    def _local(self, rid, e, n, prev_slot):
        """Step-local oracle of the segment of rid ending at e with n tokens. A segment of at
        most ONLINE_TOKEN_FOLD_MAX tokens folds one token at a time, the state stored in its
        dtype between tokens as decode stores it (contract 3.5)."""
        hd = self.hd
        toks = self.X[rid][e - n:e]
        q = torch.arange(e - n, e) % 128
        prev = None
        if (e - n) % 128 != 0 and prev_slot is not None:
            r = self.prev.view(-1, 3 * hd)[prev_slot].double()
            prev = (r[:hd], r[hd:2 * hd], r[2 * hd:])
        if n > ONLINE_TOKEN_FOLD_MAX:
            return online_step64(prev, toks[:, :hd], toks[:, hd:], self.ape[q])
        for i in range(n):
            if prev is not None:
                prev = tuple(t.to(self.sdt).double() for t in prev)
            prev = online_step64(prev, toks[i:i + 1, :hd], toks[i:i + 1, hd:], self.ape[q[i:i + 1]])
        return prev

    def _check_token(self, got, rid, s, local_K, what):
        assert_rows_close(got, local_K, self.odt, what + " (step oracle)")
        if self.sdt == F32:
            assert_rows_close(got, self.ref[rid][s // 128 - 1], self.odt, what + " (sequence oracle)")
        self.tokens_checked += 1

    def _check_state(self, written):
        """written: {slot: (rid, L, local (m, S, K))}."""
        hd = self.hd
        cur = self.state.cpu().view(-1, 3 * hd)
        prev = self.prev.view(-1, 3 * hd)
        for slot in range(self.n_slots):
            if slot not in written:
                assert_bits_equal(cur[slot:slot + 1], prev[slot:slot + 1], f"online slot {slot}")
                continue
            rid, L, (lm, lS, lK) = written[slot]
            got = cur[slot]
            if self.sdt == F32:
                assert_bits_equal(got[:hd].view(1, -1), lm.float().view(1, -1), f"online M slot {slot}")
                assert_rows_close(got[hd:2 * hd], lS, F32, f"online S slot {slot}")
                assert_rows_close(got[2 * hd:], lK, F32, f"online K slot {slot}", 1e-5, 1e-5)
                # contract 4 conformance against the whole sequence: M exact, S and K within 1e-4
                m, S, K = ref_online_state(self.X[rid][:L].to(self.idt).float(), self.ape, hd)
                assert_bits_equal(got[:hd].view(1, -1), m.float().view(1, -1), f"online M slot {slot} (seq)")
                assert_rows_close(got[hd:2 * hd], S, F32, f"online S slot {slot} (seq)", 1e-4, 1e-4)
                assert_rows_close(got[2 * hd:], K, F32, f"online K slot {slot} (seq)", 1e-4, 1e-4)
            else:  # bf16 state: the RNE of the fp32 values, within one bf16 ulp
                u = 2.0 ** -7
                assert_rows_close(got[:hd], lm, BF16, f"online M slot {slot}", u, 1e-6)
                assert_rows_close(got[hd:2 * hd], lS, BF16, f"online S slot {slot}", u, 1e-6)
                assert_rows_close(got[2 * hd:], lK, BF16, f"online K slot {slot}", u, 1e-5)
        self.prev = self.state.cpu().clone()

    def prefill(self, items, pad=False):
        reqs = [(rid, self.len[rid] + el, el) for rid, el in items]
        C, crids, W, wrids = plan_online_prefill(reqs, self.off)
        inp = torch.cat([self.X[rid][self.len[rid]:self.len[rid] + el] for rid, el in items])
        T = inp.shape[0]
        n_c = T if pad else len(C)
        plan_c = pack("<IHHii", 16, C, n_c, INVALID_C)
        plan_w = pack("<IHHii", 16, W, T if pad else len(W), INVALID_C)
        out = self._run(inp, plan_c, plan_w, n_c)
        for k, (rec, rid) in enumerate(zip(C, crids)):
            e, _, n, rp0, rp1 = rec
            _, _, K = self._local(rid, e, n, rp1 if rp1 >= 0 else rp0)
            self._check_token(out[k], rid, e, K, f"online prefill rid={rid} e={e} n={n}")
        assert bool((out[len(C):] == 0).all())
        written = {}
        for rec, rid in zip(W, wrids):
            e, _, n, rp0, rp1 = rec
            written[rp0] = (rid, e, self._local(rid, e, n, rp1 if rp1 >= 0 else rp0))
        self._check_state(written)
        for rid, el in items:
            self.len[rid] += el

    def decode(self, rids):
        reqs = [(rid, self.len[rid] + 1) for rid in rids]
        recs = [(s, rid + self.off, rid + self.off, -1) for rid, s in reqs]
        inp = torch.stack([self.X[rid][self.len[rid]] for rid in rids])
        out = self._run(inp, pack_decode(recs), None, len(rids))
        written = {}
        for b, (rid, s) in enumerate(reqs):
            local = self._local(rid, s, 1, rid + self.off)  # q == 0 restarts (no prev)
            if s % 128 == 0:
                self._check_token(out[b], rid, s, local[2], f"online decode rid={rid} s={s}")
            else:
                assert bool((out[b] == 0).all())
                written[rid + self.off] = (rid, s, local)
        self._check_state(written)
        for rid in rids:
            self.len[rid] += 1


def run_online_scenario(sim):
    sim.prefill([(1, 130), (0, 5), (3, 128)])        # closes + trailing, partial, exact chunk
    sim.prefill([(1, 200), (0, 70), (3, 2)], pad=True)  # merges with the stored state
    for _ in range(3):
        sim.decode([0, 1, 3])
    sim.prefill([(0, 50)])                             # 78 -> 128: merge + close, no trailing
    sim.decode([0, 1])                                 # restart at q == 0
    sim.prefill([(1, 124)])                            # 334 -> 458 crosses 384
    assert sim.tokens_checked > 0


@pytest.mark.parametrize("hd", [128, 512])
@pytest.mark.parametrize("sdt,idt,odt", DTYPE_COMBOS,
                         ids=[f"s{str(s)[6:]}-i{str(i)[6:]}-o{str(o)[6:]}" for s, i, o in DTYPE_COMBOS])
def test_online_sequences(device, hd, sdt, idt, odt):
    run_online_scenario(OnlineSim(device, hd, sdt, idt, odt, max_len=470, seed=hd))


def test_online_padded_prefill_many_records(device):
    """Online prefill with padded plans of over a thousand records, most of them invalid: valid
    segments as the reference, zeros for the invalid rows, and only the valid segments'
    states stored."""
    sim = OnlineSim(device, 512, max_len=1400, seed=12)
    sim.prefill([(1, 900), (0, 300), (3, 5)], pad=True)
    sim.prefill([(1, 260), (0, 700)], pad=True)
    sim.decode([0, 1, 3])


def test_online_padded_prefill_strided_blocks(device):
    """Online prefill, padded, with more valid chunks than an H200 grid has blocks (264): the
    chunks past the first stride pool in a block's later turns."""
    sim = OnlineSim(device, 512, n_req=2, max_len=34700, seed=13)
    sim.prefill([(1, 34000), (0, 650)], pad=True)
    sim.decode([0, 1])


def test_online_decode_closes_chunk(device):
    sim = OnlineSim(device, 512, max_len=260, seed=21)
    sim.prefill([(0, 120), (2, 1)])
    for _ in range(10):                      # rid 0 crosses 128 by decode (q == 127 emits K')
        sim.decode([0, 2])


def test_online_slot_offset_reads_read_page_1(device):
    """Prefill segments that do not start their chunk merge with the state at read_page_1
    (= rid, the committed bank) and store at read_page_0 (= rid + offset)."""
    hd, off = 128, 3
    sim = OnlineSim(device, hd, max_len=200, off=off, seed=5)
    # put the committed running state of the first 40 tokens of rid 1 at slot rid = 1
    m, S, K = ref_online_state(sim.X[1][:40], sim.ape, hd)
    committed = torch.cat([m, S, K]).float()
    sim.state.view(-1, 3 * hd)[1] = committed.to(sim.state.device)
    sim.prev = sim.state.cpu().clone()
    sim.len[1] = 40
    sim.prefill([(1, 100)])                  # 40 -> 140: closes 128 (merged), trailing 12
    assert sim.tokens_checked == 1
    assert torch.equal(sim.state.cpu().view(-1, 3 * hd)[1], committed)  # rp1 only read


def test_online_merge_ignores_absent_state(device):
    """A segment that does not start its chunk but whose stored-state slots are invalid (-1)
    pools its own tokens only; invalid records give zeros / store nothing."""
    hd = 128
    g = torch.Generator().manual_seed(31)
    inp = torch.randn(10, 2 * hd, generator=g)
    ape = _ape(128, hd)
    st = torch.randn(3, 1, 3 * hd, generator=g)
    before = st.clone()
    st = st.to(device)
    plan_c = pack("<IHHii", 16, [(128, 9, 10, -1, -1)] + [INVALID_C], None, INVALID_C)
    plan_w = pack("<IHHii", 16, [INVALID_C, (70, 4, 5, 7, -1)], None, INVALID_C)
    out = torch.full((2, hd), float("nan"), device=device)
    OP(st, inp.to(device), ape.to(device), plan_c.to(device), plan_w.to(device), out, hd, 128, True)
    kv, sc = inp[:, :hd], inp[:, hd:]
    ref = pool64(kv, sc, ape[118:128], [True] * 10)
    assert_rows_close(out[0], ref, F32, "segment without stored state")
    assert bool((out[1] == 0).all())
    assert torch.equal(st.cpu(), before)  # slot 7 is past the buffer, rp1 -1 / rp0 7: nothing


# ---------------------------------------------------------------------------------------------
# argument errors
# ---------------------------------------------------------------------------------------------
def _good_args(device, cr=4, hd=128, online=False):
    row = 3 * hd if online else kv_score_row_width(cr, hd)
    st = torch.zeros(2, 1 if online else cr, row, device=device)
    inp = torch.zeros(2, kv_score_row_width(cr, hd), device=device)
    ape = torch.zeros(window_size(cr), hd, device=device)
    plan = pack_decode([(1, 0, 0, 0), (2, 1, 0, 0)]).to(device)
    out = torch.zeros(2, hd, device=device)
    return [st, inp, ape, plan, None, out, hd, cr, online]


@pytest.mark.parametrize("mutate,arg", [
    (lambda a: a.__setitem__(6, 256), "head_dim"),
    (lambda a: a.__setitem__(7, 8), "compress_ratio"),
    (lambda a: a.__setitem__(8, True), "is_online"),
    (lambda a: a.__setitem__(0, a[0].double()), "kv_score_buffer"),
    (lambda a: a.__setitem__(0, a[0][..., :-4]), "kv_score_buffer"),
    (lambda a: a.__setitem__(0, torch.cat([a[0], a[0]], -1)[..., :a[0].shape[-1]]), "kv_score_buffer"),
    (lambda a: a.__setitem__(1, a[1].half()), "kv_score_input"),
    (lambda a: a.__setitem__(1, a[1][:1]), "kv_score_input"),
    (lambda a: a.__setitem__(1, a[1][:, :-4].contiguous()), "kv_score_input"),
    (lambda a: a.__setitem__(1, torch.zeros(4, 2, 128, device=a[1].device)), "kv_score_input"),
    (lambda a: a.__setitem__(2, a[2][:4]), "ape"),
    (lambda a: a.__setitem__(2, a[2].double()), "ape"),
    (lambda a: a.__setitem__(3, a[3][:, :8]), "plan"),
    (lambda a: a.__setitem__(3, a[3].view(torch.int32)), "plan"),
    (lambda a: a.__setitem__(4, torch.zeros(2, 16, dtype=torch.uint8, device=a[3].device)), "plan_w"),
    (lambda a: a.__setitem__(5, a[5][:, :64]), "out"),
    (lambda a: a.__setitem__(5, torch.zeros(3, a[5].shape[1], device=a[5].device)), "out"),
    (lambda a: a.__setitem__(5, a[5].half()), "out"),
    (lambda a: a.__setitem__(5, torch.zeros(128, 2, device=a[5].device).t()), "out"),
])
def test_argument_errors(device, mutate, arg):
    args = _good_args(device)
    OP(*args)  # the unmodified call is fine
    mutate(args)
    with pytest.raises(RuntimeError, match=rf"compress_forward.*{arg}"):
        OP(*args)


def test_wrong_device_is_an_error(device):
    if device.type == "cpu":
        pytest.skip("needs a second device type")
    args = _good_args(device)
    args[3] = args[3].cpu()
    with pytest.raises(RuntimeError, match="compress_forward.*plan"):
        OP(*args)


def test_unaligned_views_rejected_on_gpu(device):
    if device.type == "cpu":
        pytest.skip("GPU alignment rule")
    args = _good_args(device)
    flat = torch.zeros(2 * 512 + 1, device=device)
    args[1] = flat[1:].view(2, 512)
    with pytest.raises(RuntimeError, match="compress_forward.*kv_score_input"):
        OP(*args)


# ---------------------------------------------------------------------------------------------
# non-finite inputs (contract 1.2: the float64 softmax): NaN propagates, as the canonical NaN
# ---------------------------------------------------------------------------------------------
CANONICAL_NAN = {F32: 0x7FC00000, BF16: 0x7FC0}
NAN_SCORE, NAN_APE, NAN_KV, POS_INF, NEG_INF = (slice(8 * i, 8 * i + 8) for i in range(5))


def _nonfinite_case(cr, hd, L, rows, seed):
    """Rows [L, row] and ape with, per 8-channel group: a NaN score (row rows[0]), a NaN ape
    entry (window row 5), a NaN kv (row rows[1]), a +inf score (row rows[2]), and -inf scores on
    every row (every window pools 0 there). cr = 4 rows carry them in their current quarters."""
    g = torch.Generator().manual_seed(seed)
    x = random_rows(g, L, cr, hd, False)
    ape = torch.randn(window_size(cr), hd, generator=g) * 0.5
    kv0, sc0 = (hd, 3 * hd) if cr == 4 else (0, hd)
    x[rows[0], sc0 + NAN_SCORE.start:sc0 + NAN_SCORE.stop] = float("nan")
    ape[5, NAN_APE] = float("nan")
    x[rows[1], kv0 + NAN_KV.start:kv0 + NAN_KV.stop] = float("nan")
    x[rows[2], sc0 + POS_INF.start:sc0 + POS_INF.stop] = float("inf")
    for q in ([2 * hd, 3 * hd] if cr == 4 else [hd]):
        x[:, q + NEG_INF.start:q + NEG_INF.stop] = float("-inf")
    return x, ape


def assert_matches_oracle(got, ref, odt, what, rtol=None, atol=None):
    """got against the float64 oracle row: the canonical NaN where the oracle is NaN, except
    the all -inf channels, which pool to 0 (the README's decision; softmax gives NaN)."""
    ref = ref.clone()
    assert torch.isnan(ref[NEG_INF]).all(), f"{what}: the oracle's all -inf channels"
    ref[NEG_INF] = 0.0
    nan = torch.isnan(ref)
    g = got.detach().cpu()
    assert bool((bits(g)[nan] == torch.tensor(CANONICAL_NAN[odt]).to(bits(g).dtype)).all()), \
        f"{what}: not the canonical NaN where the oracle is NaN"
    assert_rows_close(g[~nan], ref[~nan], odt, what, rtol, atol)


def _offline_nonfinite(device, cr, hd, x, ape, steps, odt=F32):
    """Feeds one request's rows x by steps ('p', n): a prefill extend of n rows, ('d', n): n
    decode steps. Returns {s: output row} of every window closed."""
    gen = torch.Generator().manual_seed(3)
    addr = Addr(cr, 8 if cr == 4 else 128, 1, gen)
    state = torch.zeros(addr.num_pages, cr, kv_score_row_width(cr, hd)).to(device)
    ape_d, L, got = ape.to(device), 0, {}
    for kind, n in steps:
        for _ in range(1 if kind == "p" else n):
            m = n if kind == "p" else 1
            if kind == "p":
                C, _, W = plan_prefill(addr, cr, [(0, L + m, m)])
                plan, plan_w, ends = pack_compress(C), pack_write(W), [r[0] for r in C]
            else:
                plan, plan_w = pack_decode(plan_decode(addr, cr, [(0, L + 1)])), None
                ends = [L + 1]
            out = torch.full((len(ends), hd), 7.0, dtype=odt, device=device)
            OP(state, x[L:L + m].to(device), ape_d, plan.to(device),
               None if plan_w is None else plan_w.to(device), out, hd, cr, False)
            got.update({s: out[k].cpu() for k, s in enumerate(ends) if s % cr == 0})
            L += m
    return got


@pytest.mark.parametrize("cr", [4, 128])
@pytest.mark.parametrize("mode", ["prefill", "decode"])
@pytest.mark.parametrize("odt", [F32, BF16], ids=["of32", "obf16"])
def test_nonfinite_offline(device, cr, mode, odt):
    """NaN in a score, in ape or in kv and a +inf score pool to the canonical NaN wherever the
    float64 softmax gives NaN; a channel whose logits are all -inf pools to 0."""
    hd = 128
    L, rows = (24, (9, 14, 18)) if cr == 4 else (256, (130, 10, 200))
    x, ape = _nonfinite_case(cr, hd, L, rows, seed=cr)
    if mode == "prefill":  # the second extend reads the first one's rows from the state
        steps = [("p", 10), ("p", 14)] if cr == 4 else [("p", 100), ("p", 156)]
    else:
        steps = [("p", 5), ("d", 19)] if cr == 4 else [("p", 60), ("d", 196)]
    got = _offline_nonfinite(device, cr, hd, x, ape, steps, odt)
    ref = ref_tokens(x, ape, cr, hd)
    assert sorted(got) == list(range(cr, L + 1, cr))
    for s, row in got.items():
        assert_matches_oracle(row, ref[s // cr - 1], odt, f"{mode} cr={cr} s={s}")
    assert all(torch.isnan(ref[:, c]).any() for c in (NAN_SCORE, NAN_APE, NAN_KV, POS_INF))


def test_nonfinite_online(device):
    """Online prefill (closing and open segments) and decode: NaN outputs and running states
    where the float64 oracle has NaN, the canonical NaN in S and K (m stays the max of the
    other logits), 0 for the all -inf channels."""
    hd = 128
    x, ape = _nonfinite_case(128, hd, 258, (100, 40, 150), seed=7)
    state = torch.zeros(2, 1, 3 * hd).to(device)
    ape_d, L = ape.to(device), 0
    ref = ref_tokens(x, ape, 128, hd)
    closed = []

    def check_state(what):
        _, S, K = ref_online_state(x[:L], ape, hd)
        st = state.cpu().view(-1, 3 * hd)[0]
        neg = torch.zeros(hd, dtype=torch.bool)
        neg[NEG_INF] = True
        for name, got, want in (("S", st[hd:2 * hd], S), ("K", st[2 * hd:], K)):
            nan = torch.isnan(want) & ~neg
            assert bool((bits(got)[nan] == CANONICAL_NAN[F32]).all()), f"{what}: {name} not NaN"
            assert_rows_close(got[~nan & ~neg], want[~nan & ~neg], F32, f"{what} {name}", 1e-4, 1e-4)
        # All -inf channels: K = 0 (S counts the absent rows' weights, which K does not see).
        assert bool((st[2 * hd:][neg] == 0).all()), f"{what}: K of the -inf channels"

    for n in (70, 100):  # 0 -> 70 (open), 70 -> 170: closes 128 (merged), open 42
        C, _, W, _ = plan_online_prefill([(0, L + n, n)], 0)
        out = torch.full((len(C), hd), 7.0, device=device)
        OP(state, x[L:L + n].to(device), ape_d, pack("<IHHii", 16, C, None, INVALID_C).to(device),
           pack("<IHHii", 16, W, None, INVALID_C).to(device), out, hd, 128, True)
        closed += [(rec[0], out[k].cpu()) for k, rec in enumerate(C)]
        L += n
        check_state(f"online prefill L={L}")
    for _ in range(88):  # 170 -> 258: closes 256 by decode, then restarts the chunk
        out = torch.full((1, hd), 7.0, device=device)
        OP(state, x[L:L + 1].to(device), ape_d, pack_decode([(L + 1, 0, 0, -1)]).to(device),
           None, out, hd, 128, True)
        L += 1
        if L % 128 == 0:
            closed.append((L, out[0].cpu()))
        elif L % 128 > 5:  # (a state of fewer rows does not reach ape row 5 yet)
            check_state(f"online decode L={L}")
    assert [s for s, _ in closed] == [128, 256]
    for s, row in closed:
        assert_matches_oracle(row, ref[s // 128 - 1], F32, f"online s={s}")
