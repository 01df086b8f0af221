"""Speculative decoding (docs/contract.md 10): the online cr = 128 draft ops against the online
decode they stand in for, and verify-then-accept against token-by-token decode for every
compressor and addressing mode (replay identity), with NaN rows for every rejected draft."""
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dsv4_ops
from dsv4_ops import spec
from dsv4_ops.plans import CompressorPrefillPlan
from dsv4_ops.testing import reference

from conftest import DEVICES
from spec_cases import Case, Engine, bits, make_rows

CASES = [
    Case(4, 128, "swa_paged", 16),
    Case(4, 512, "req_ring", 16),
    Case(4, 128, "legacy", None),
    Case(128, 128, "req_ring", 256),
    Case(128, 128, "legacy", None),
    Case(128, 128, "online", None),
    Case(128, 512, "online", None, torch.bfloat16),
    Case(4, 128, "swa_paged", 16, torch.bfloat16),
]


def _replay(case: Case, device, batch: int, prefixes, rounds, seed: int):
    """(verify engine, token-by-token engine) after the same accepted tokens. rounds: a list
    of (D, accepts) with 1 <= accepts[b] <= D."""
    length = max(prefixes) + sum(d for d, _ in rounds) + 1
    rows = make_rows(case, batch, length, seed)
    ver = Engine(case, rows, device, seed=seed)
    tok = Engine(case, rows, device, seed=seed)
    ver.prefill(list(prefixes))
    tok.prefill(list(prefixes))
    for d, accepts in rounds:
        ver.verify(d, accepts)
    ver.finish()
    while True:
        todo = [b for b in range(batch) if tok.lens[b] < ver.lens[b]]
        if not todo:
            break
        tok.decode(todo)
    return ver, tok


def _assert_identical(case: Case, ver: Engine, tok: Engine) -> None:
    assert ver.lens == tok.lens
    # Compressed rows: every window of every request.
    assert ver.outputs.keys() == tok.outputs.keys()
    for key in tok.outputs:
        got, want = ver.outputs[key], tok.outputs[key]
        assert not torch.isnan(got.float()).any(), f"{case} window {key}: a rejected row leaked"
        assert torch.equal(bits(got), bits(want)), f"{case} window {key}"
    # Cache bytes of every real compressed token.
    assert torch.equal(ver.live_cache().cpu(), tok.live_cache().cpu()), f"{case} cache"
    # Every state row a later step may read.
    for key, slot in tok.readable_slots().items():
        a, b = ver.state[slot], tok.state[slot]
        assert torch.equal(bits(a), bits(b)), f"{case} state row of {key} (slot {slot})"


def _rounds(rng: random.Random, case: Case, n: int, widths=None):
    out = []
    for _ in range(n):
        d = rng.choice(widths) if widths else rng.randint(1, case.max_verify())
        out.append((d, None))
    return out


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("case", CASES, ids=str)
@settings(max_examples=4)
@given(data=st.data())
def test_replay_identity(case, dev, data):
    """Random batches, verify widths up to what the ring holds (8 for the online state: 7
    drafts and the bonus token), random acceptance per request: the verify run's rows, cache and
    state equal token-by-token decode of the accepted tokens."""
    batch = data.draw(st.integers(1, 4), label="batch")
    lo, hi = (100, 300) if case.compress_ratio == 128 else (0, 40)
    prefixes = data.draw(st.lists(st.integers(lo, hi), min_size=batch, max_size=batch),
                         label="prefixes")
    cap = case.max_verify()
    n_rounds = data.draw(st.integers(1, 6), label="rounds")
    rounds = []
    for _ in range(n_rounds):
        d = data.draw(st.integers(1, cap), label="D")
        acc = data.draw(st.lists(st.integers(1, d), min_size=batch, max_size=batch),
                        label="accepts")
        rounds.append((d, acc))
    ver, tok = _replay(case, dev, batch, prefixes, rounds, seed=len(rounds))
    _assert_identical(case, ver, tok)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_replay_identity_devices(case, device):
    """Every draft depth accepted and rejected, across ring wrap (c4 rings of 16, c128 of 256,
    the online chunk of 128), on every device."""
    rng = random.Random(7)
    batch = 3
    cap = case.max_verify()
    prefixes = [250, 120, 5] if case.compress_ratio == 128 else [13, 2, 30]
    rounds = []
    for d in list(range(1, cap + 1)) * (2 if cap < 8 else 1):
        rounds.append((d, [rng.randint(1, d) for _ in range(batch)]))
    rounds.append((cap, [cap, 1, max(1, cap - 1)]))
    ver, tok = _replay(case, device, batch, prefixes, rounds, seed=3)
    _assert_identical(case, ver, tok)


@pytest.mark.parametrize("case", [c for c in CASES if c.max_verify() > 4], ids=str)
def test_more_than_four_drafts(case, device):
    """Verify widths 5..8 (the reference engine's silent KV corruption beyond 4 draft tokens),
    each with the fewest and the most accepted tokens."""
    for d in range(5, min(case.max_verify(), 8) + 1):
        for accept in (1, d // 2, d):
            rounds = [(d, [accept, 1])] * 3 + [(d, [d, accept])] * 2
            ver, tok = _replay(case, device, 2, [126, 3], rounds, seed=d + accept)
            _assert_identical(case, ver, tok)


@pytest.mark.parametrize("depth", range(1, 9))
def test_each_draft_depth_online(depth, device):
    """The online state after accepting exactly `depth` of 8 verify tokens, at every offset of
    the chunk near its end (the chunk closes inside the verify at some depths)."""
    case = Case(128, 128, "online", None)
    for prefix in (0, 119, 120, 121, 126, 127):
        ver, tok = _replay(case, device, 1, [prefix], [(8, [depth]), (8, [depth])], seed=depth)
        _assert_identical(case, ver, tok)


def test_batched_verify_bitwise(device):
    """A batched verify gives the bytes of token-by-token replay (greedy identity): c4 and c128
    offline windows bit for bit, the online windows and committed state bit for bit."""
    for case in (Case(4, 512, "swa_paged", 16), Case(128, 512, "req_ring", 256),
                 Case(128, 512, "online", None)):
        rounds = [(4, [4, 2, 1, 3]), (4, [1, 4, 4, 2]), (3, [3, 3, 1, 2])]
        ver, tok = _replay(case, device, 4, [125, 3, 254, 60], rounds, seed=11)
        _assert_identical(case, ver, tok)


def test_shared_prefix_c4_not_aliased(device):
    """Two requests that share an SWA page of prefix (the cache hands the second the first's
    pages) verify different drafts in one batch: each one's windows match the whole-sequence
    oracle, and neither's rejected drafts reach the other's state."""
    case = Case(4, 128, "swa_paged", 16)
    prefix = 64  # one whole SWA page
    rows = make_rows(case, 2, 200, seed=5)
    rows[1][:prefix] = rows[0][:prefix]
    eng = Engine(case, rows, device, seed=5)
    # Request 1's prefix positions map onto request 0's SWA page.
    f2s = eng.full_to_state.clone()
    r2t = eng.req_to_token
    f2s[r2t[1, :prefix].long()] = f2s[r2t[0, :prefix].long()]
    eng.full_to_state = f2s
    eng.prefill([prefix, 0])
    eng.lens = [prefix, prefix]
    rng = random.Random(1)
    for _ in range(10):
        d = rng.randint(1, case.max_verify())
        eng.verify(d, [rng.randint(1, d), rng.randint(1, d)])
    for b in range(2):
        want = reference.compressed_tokens(rows[b][:eng.lens[b]], eng.ape.cpu(), 4, 128)
        for k in range(prefix // 4, eng.lens[b] // 4):
            torch.testing.assert_close(eng.outputs[(b, k)].cpu(), want[k].float(), atol=1e-4,
                                       rtol=1e-4)


# ---- the ops themselves ------------------------------------------------------------------------

def _online_world(device, hd=512, B=5, D=7, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    stride = B + 3
    state = torch.randn(stride * (D + 1), 3 * hd, generator=gen)
    state[:, hd:2 * hd] = state[:, hd:2 * hd].abs() + 0.5
    state = state.to(device, dtype)
    x = torch.randn(B * D, 2 * hd, generator=gen).to(device)
    ape = torch.randn(128, hd, generator=gen).to(device)
    seq = torch.tensor([0, 5, 127, 125, 300][:B], device=device)
    req = torch.tensor([2, 0, 4, 1, 3][:B], device=device)
    r2t = torch.zeros(stride, 8, dtype=torch.int32, device=device)
    return state, x, ape, seq, req, r2t, stride


def test_write_prefix_equals_online_decode(device):
    """Each staged bank is the state online decode of the same tokens stores, bit for bit."""
    for dtype in (torch.float32, torch.bfloat16):
        hd, B, D = 512, 5, 7
        state, x, ape, seq, req, r2t, stride = _online_world(device, hd, B, D, dtype)
        staged = state.clone()
        spec.online_c128_mtp_write_prefix_states(x, seq, req, r2t, ape, staged, B, D, stride,
                                                 head_dim=hd)
        dec = state.clone()
        view = dec.view(-1, 1, 3 * hd)
        for step in range(D):
            plan = dsv4_ops.CompressorDecodePlan.generate_online(seq + step + 1, req, r2t)
            dsv4_ops.compress_forward(view, x.view(B, D, -1)[:, step], ape, plan, head_dim=hd,
                                      compress_ratio=128, is_online=True)
            for b in range(B):
                final = int(seq[b]) + step + 1
                slot = int(req[b]) + (step + 1) * stride
                if final % 128:
                    assert torch.equal(bits(staged[slot]), bits(dec[int(req[b])])), (b, step)
                else:  # a closing token stages nothing
                    assert torch.equal(bits(staged[slot]), bits(state[slot])), (b, step)
        # The main slots are only read.
        for b in range(B):
            assert torch.equal(bits(staged[int(req[b])]), bits(state[int(req[b])]))


def test_write_prefix_matches_oracle(device):
    """Staged states against the whole-sequence oracle (reference.online_state)."""
    hd, D = 128, 8
    gen = torch.Generator().manual_seed(3)
    hist = torch.randn(140, 2 * hd, generator=gen)
    ape = torch.randn(128, hd, generator=gen)
    stride = 2
    state = torch.zeros(stride * (D + 1), 3 * hd)
    for prefix in (0, 3, 124):
        if prefix % 128:
            m, s, k = reference.online_state(hist[:prefix], ape, hd)
            state[0] = torch.cat([m, s, k]).float()
        st_dev = state.to(device)
        x = hist[prefix:prefix + D].to(device)
        spec.online_c128_mtp_write_prefix_states(
            x, torch.tensor([prefix], device=device), torch.tensor([0], device=device),
            torch.zeros(1, 1, dtype=torch.int32, device=device), ape.to(device), st_dev, 1, D,
            stride, head_dim=hd)
        for step in range(D):
            n = prefix + step + 1
            if n % 128 == 0:
                continue
            m, s, k = reference.online_state(hist[:n], ape, hd)
            got = st_dev[(step + 1) * stride].cpu()
            torch.testing.assert_close(got[:hd], m.float())
            torch.testing.assert_close(got[hd:2 * hd], s.float(), rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(got[2 * hd:], k.float(), rtol=1e-4, atol=1e-4)


def test_mark_pending(device):
    seq = torch.tensor([7, 9, 11], dtype=torch.int32, device=device)
    req = torch.tensor([3, -1, 1], device=device)
    pending = torch.full((6,), 42, dtype=torch.int64, device=device)
    spec.online_c128_mtp_mark_pending(seq, req, pending, 3, 5, head_dim=512,
                                      state_dtype=torch.float32)
    assert pending.tolist() == [-1, 11, -1, 7, -1, 42]  # entries past num_req_slots untouched
    spec.online_c128_mtp_mark_pending(seq, req, pending, 0, 5, head_dim=512,
                                      state_dtype=torch.float32)
    assert pending.tolist() == [-1, 11, -1, 7, -1, 42]  # an empty batch changes nothing


def test_commit_pending(device):
    """accept = clamp(seq - pending, 0, D); nothing on a chunk boundary, without a pending
    verify, or for a request row outside [0, num_req_slots)."""
    hd, D, stride = 128, 4, 8
    state = torch.arange(stride * (D + 1) * 3 * hd, dtype=torch.float32,
                         device=device).view(-1, 3 * hd)
    pending = torch.tensor([10, 10, 10, 126, -1, 10, 10, 10], device=device)
    req = torch.tensor([0, 1, 2, 3, 4, 5, 6, 9], device=device)
    seq = torch.tensor([12, 99, 9, 128, 20, 10, 11, 13], device=device)
    before = state.clone()
    spec.online_c128_mtp_commit_pending(seq, req, torch.zeros(1, 1, dtype=torch.int32,
                                                              device=device),
                                        pending, state, 8, D, stride, 8, head_dim=hd)
    want = before.clone()
    want[0] = before[0 + 2 * stride]  # accept 2
    want[1] = before[1 + 4 * stride]  # clamped to D
    want[6] = before[6 + 1 * stride]  # accept 1
    # 2: accept 0; 3: final 128 on a boundary; 4: no pending; 5: accept 0; row 9 outside.
    assert torch.equal(state, want)


def test_cuda_graph_replay_changing_accepts(device):
    """A verify step captured once (commit, mark, plan, compress, store, staging) and replayed
    with other accept lengths gives the eager bytes."""
    if device.type != "cuda":
        pytest.skip("CUDA graphs need a GPU")
    for case in (Case(128, 512, "online", None), Case(4, 512, "swa_paged", 16),
                 Case(128, 128, "req_ring", 256)):
        D, B = 4, 3
        rows = make_rows(case, B, 600, seed=2)
        eager = Engine(case, rows, device, seed=2)
        graph = Engine(case, rows, device, seed=2)
        for e in (eager, graph):
            e.prefill([120, 3, 250])
            e.last_d = D
        rng = random.Random(0)
        x0, locs0 = graph.verify_inputs(D, [1] * B)
        seq_s = torch.tensor(graph.lens, dtype=torch.int64, device=device)
        x_s = x0.clone()
        loc_s = torch.tensor(locs0, dtype=torch.int64, device=device)
        # Warm up on a side stream, then capture (state and cache are restored after).
        snap = (graph.state.clone(), graph.cache.clone(), getattr(graph, "pending", None))
        snap = tuple(t.clone() if t is not None else None for t in snap)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            graph.verify_step(seq_s, x_s, loc_s, D)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            kv_s = graph.verify_step(seq_s, x_s, loc_s, D)
        graph.state.copy_(snap[0])
        graph.cache.copy_(snap[1])
        if snap[2] is not None:
            graph.pending.copy_(snap[2])
        for _ in range(6):
            accepts = [rng.randint(1, D) for _ in range(B)]
            eager.verify(D, accepts)
            x, locs = graph.verify_inputs(D, accepts)
            seq_s.copy_(torch.tensor(graph.lens, device=device))
            x_s.copy_(x)
            loc_s.copy_(torch.tensor(locs, device=device))
            g.replay()
            graph.record_verify(kv_s, D, accepts)
        eager.finish()
        graph.finish()
        assert torch.equal(bits(eager.state), bits(graph.state))
        assert torch.equal(eager.live_cache().cpu(), graph.live_cache().cpu())
        for key in eager.outputs:
            assert torch.equal(bits(eager.outputs[key]), bits(graph.outputs[key])), key


# ---- verify widths the rings hold --------------------------------------------------------------

@pytest.mark.parametrize("cr,ring,cap", [(4, 8, 2), (4, 16, 10), (4, 32, 26), (128, 128, 1),
                                         (128, 256, 130)])
def test_max_verify_tokens(cr, ring, cap):
    assert spec.max_verify_tokens(cr, ring) == cap


def test_verify_planner_rejects_wider_than_ring():
    rid = torch.tensor([0])
    seq = torch.tensor([5])
    r2t = torch.zeros(1, 64, dtype=torch.int32)
    f2s = torch.zeros(64, dtype=torch.int64)
    CompressorPrefillPlan.generate_verify(4, rid, seq, 10, r2t, f2s, 64, 16)
    with pytest.raises(ValueError, match=r"generate_verify: num_verify_tokens 11 is more than a "
                                         r"ring of 16 rows holds for compress_ratio 4 \(at most 10"):
        CompressorPrefillPlan.generate_verify(4, rid, seq, 11, r2t, f2s, 64, 16)
    with pytest.raises(ValueError, match="generate_verify_legacy: num_verify_tokens 2 .*at most 1"):
        CompressorPrefillPlan.generate_verify_legacy(128, rid, seq, 2, "cpu")
    with pytest.raises(ValueError, match="num_verify_tokens must be at least 1"):
        CompressorPrefillPlan.generate_online_verify(seq, 0, rid, r2t)


def test_verify_plan_is_the_extend_plan():
    """generate_verify is plan_prefill of extend = D after the committed lengths."""
    rid = torch.tensor([0, 1])
    seq = torch.tensor([5, 30])
    r2t = torch.arange(128, dtype=torch.int32).view(2, 64)
    f2s = torch.arange(128, dtype=torch.int64)
    got = CompressorPrefillPlan.generate_verify(4, rid, seq, 6, r2t, f2s, 64, 16,
                                                use_cuda_graph=False)
    want = CompressorPrefillPlan.generate(4, rid, seq + 6, torch.tensor([6, 6]), r2t, f2s, 64,
                                          16, 12)
    assert torch.equal(got.plan_c, want.plan_c) and torch.equal(got.plan_w, want.plan_w)


def test_wider_than_the_ring_corrupts():
    """Why generate_verify refuses widths past max_verify_tokens: the same run with 12 verify
    tokens on a ring of 16 (at most 10), planned by plan_prefill directly, lets a rejected
    draft overwrite a row that a later window reads."""
    case = Case(4, 128, "req_ring", 16)
    rows = make_rows(case, 1, 200, seed=1)
    eng = Engine(case, rows, "cpu", seed=1)
    eng.prefill([21])
    d = 12
    for _ in range(8):
        x, locs = eng.verify_inputs(d, [1])
        seq = torch.tensor(eng.lens)
        plan = CompressorPrefillPlan.generate(4, eng.rid_all, seq + d, torch.tensor([d]),
                                              eng.req_to_token, eng.full_to_state, 64, 16, d,
                                              use_req_ring=True)
        kv = eng._forward(x, plan)
        eng.record_verify(kv, d, [1])
    leaked = [k for k, v in eng.outputs.items() if torch.isnan(v).any()]
    assert leaked, "a draft past the ring's capacity should have clobbered a live row"


# ---- the ops through PyTorch's machinery -------------------------------------------------------

from op_samples import spec_samples  # noqa: E402
from sample_tests import clone, mutated, sample_tests  # noqa: E402

SAMPLES = sorted(spec_samples("cpu"))


test_opcheck, test_samples_write_only_their_outputs, test_meta_tensors, \
    test_compiled_equals_eager = sample_tests(spec_samples)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", SAMPLES)
def test_cuda_equals_cpu(name):
    """The GPU kernels give the CPU's bytes for mark and commit; staged banks within the
    backends' tolerance (contract 6: the hardware exponential)."""
    op, args = spec_samples("cpu")[name]
    cpu = clone(args)
    gpu = [a.cuda() if isinstance(a, torch.Tensor) else a for a in clone(args)]
    op(*cpu)
    op(*gpu)
    for i in mutated(op, args):
        if name.startswith("write_prefix"):
            tol = 1e-5 if cpu[i].dtype == torch.float32 else 1e-2  # bf16: an ulp apart
            torch.testing.assert_close(gpu[i].cpu().float(), cpu[i].float(), rtol=tol, atol=tol)
        else:
            assert torch.equal(gpu[i].cpu(), cpu[i]), f"{name}: argument {i}"


# ---- errors name the op and the argument ---------------------------------------------------------

ERRORS = [
    ("write_prefix_states_float32", 0, lambda a: a[:, :100], "kv_score_input must have 256"),
    ("write_prefix_states_float32", 0, lambda a: a[:5], "kv_score_input has 5 rows"),
    ("write_prefix_states_float32", 1, lambda a: a.float(), "seq_lens must have dtype"),
    ("write_prefix_states_float32", 2, lambda a: a[:2], "req_pool_indices has 2 entries"),
    ("write_prefix_states_float32", 3, lambda a: a.long(), "req_to_token must have dtype"),
    ("write_prefix_states_float32", 4, lambda a: a[:64], "ape must be \\[128, 128\\]"),
    ("write_prefix_states_float32", 5, lambda a: a.half(), "state must have dtype"),
    ("write_prefix_states_float32", 5, lambda a: a[:, :100], "state must be \\[num_slots, 384\\]"),
    ("write_prefix_states_float32", 7, 0, "num_verify_tokens must be at least 1"),
    ("write_prefix_states_float32", 8, 0, "state_slot_stride must be at least 1"),
    ("write_prefix_states_float32", 9, 256, "head_dim must be 128 or 512"),
    ("mark_pending", 2, lambda a: a.int(), "pending_seq_lens must have dtype"),
    ("mark_pending", 4, 9, "num_req_slots must lie in \\[0, 5\\]"),
    ("mark_pending", 0, lambda a: a[:1], "seq_lens has 1 entries"),
    ("commit_pending", 3, lambda a: a[:2], "num_req_slots must lie in \\[0, 2\\]"),
    ("commit_pending", 4, lambda a: a.t(), "state must"),
    ("commit_pending", 6, -1, "num_verify_tokens must be at least 1"),
]


@pytest.mark.parametrize("name,i,bad,msg", ERRORS)
@pytest.mark.parametrize("meta", [False, True])
def test_errors(name, i, bad, msg, meta):
    op, args = spec_samples("cpu")[name]
    args = list(args)
    args[i] = bad(args[i]) if callable(bad) else bad
    if meta:
        args = [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args]
    opname = "online_c128_mtp_" + name.rsplit("_", 1)[0] if name.startswith("write") else \
        "online_c128_mtp_" + name
    with pytest.raises(RuntimeError, match=f"dsv4.{opname}: {msg}"):
        op(*args)


def test_gpu_row_alignment():
    """The GPU staging kernel moves two channels as one vector: a padded row pitch of an even
    stride gives the contiguous input's bytes, a row off the vector boundary raises."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    op, args = spec_samples("cuda")["write_prefix_states_float32"]
    x, state = args[0], args[5]
    want = state.clone()
    op(*[want if i == 5 else a for i, a in enumerate(args)])
    padded = torch.full((x.shape[0], x.shape[1] + 2), float("nan"), device=x.device)
    padded[:, :x.shape[1]] = x
    got = state.clone()
    op(*[padded[:, :x.shape[1]] if i == 0 else got if i == 5 else a for i, a in enumerate(args)])
    assert torch.equal(bits(got), bits(want))
    odd = torch.zeros(x.shape[0], x.shape[1] + 1, device=x.device)
    odd[:, 1:] = x
    with pytest.raises(RuntimeError, match="dsv4.online_c128_mtp_write_prefix_states: "
                                           "kv_score_input must start on a 8-byte boundary"):
        op(*[odd[:, 1:] if i == 0 else a for i, a in enumerate(args)])


def test_errors_device_mix():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    op, args = spec_samples("cuda")["commit_pending"]
    args = list(args)
    args[0] = args[0].cpu()
    with pytest.raises(RuntimeError, match="online_c128_mtp_commit_pending: seq_lens must be on"):
        op(*args)
