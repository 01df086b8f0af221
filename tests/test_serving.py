"""End-to-end serving scenarios: dsv4_ops.testing.simulate drives the planners, compress_forward
and compress_norm_rope_store the way a serving engine does, step after step, and checks every
compressed token against dsv4_ops.testing.reference (whole-sequence oracle), every byte of the
compressed caches against a reference-written shadow, and every state-buffer row (rows no
step persists must stay untouched). A step that disagrees raises SimulationMismatch."""
import random

import pytest
import torch

from dsv4_ops.testing import simulate
from dsv4_ops.testing.simulate import (CompressorConfig, ServingSimulator, SimulationMismatch,
                                       deepseek_v4_compressors)

F32, BF16 = torch.float32, torch.bfloat16


SHORT = {"fp8_indexer": "fp8", "fp4_indexer": "fp4", "fp8_ds_mla": "fp8", "bf16": "bf16"}


def idx(fmt="fp8_indexer", **kw):
    """The cr=4 indexer compressor (head_dim 128)."""
    return CompressorConfig(4, 128, fmt, name=f"c4_idx_{SHORT[fmt]}", **kw)


def c4_main(fmt="fp8_ds_mla", **kw):
    return CompressorConfig(4, 512, fmt, name=f"c4_main_{SHORT[fmt]}", **kw)


def c128_main(fmt="fp8_ds_mla", **kw):
    name = "c128_online" if kw.get("addressing") == "online" else f"c128_main_{SHORT[fmt]}"
    return CompressorConfig(128, 512, fmt, name=name, **kw)


def all_compressors(**kw):
    """Both compressors of DeepSeek-V4 with every store: indexer fp8 + fp4, main cr 4 / 128
    with fp8_ds_mla, plus a bf16-store main cr=4 and the online cr=128 variant."""
    return [idx("fp8_indexer", **kw), idx("fp4_indexer", **kw), c4_main(**kw), c128_main(**kw),
            c4_main("bf16", **kw), c128_main(addressing="online", **kw)]


def make_sim(device, compressors=None, **kw):
    kw.setdefault("max_requests", 3)
    kw.setdefault("max_context", 1280)
    kw.setdefault("seed", 1234)
    return ServingSimulator(compressors or all_compressors(), device=device, **kw)


def windows_closed(prefix, n, cr):
    return (prefix + n) // cr - prefix // cr


def step(sim, batch, kind=None):
    """sim.step plus an accounting check: one compressed token per window closed."""
    prefixes = [r.seq_len for r, _ in batch]
    res = sim.step(batch, kind)
    for comp in sim.compressors:
        cr = comp.cfg.compress_ratio
        want = sum(windows_closed(p, n, cr) for p, (_, n) in zip(prefixes, batch))
        assert res.reports[comp.cfg.name].compressed == want
    return res


def decode_steps(sim, reqs, n):
    for _ in range(n):
        step(sim, [(r, 1) for r in reqs], "decode")


# ---------------------------------------------------------------------------------------
# Prefill from scratch, decode, extend
# ---------------------------------------------------------------------------------------
PREFILL_LENGTHS = [1, 3, 4, 5, 7, 8, 9, 127, 128, 129, 255, 256, 257, 1000, 1100]


@pytest.mark.parametrize("length", PREFILL_LENGTHS)
def test_prefill_from_scratch(device, length):
    sim = make_sim(device, max_requests=1, max_context=1152)
    req = sim.add_request()
    res = step(sim, [(req, length)])
    assert res.kind == "extend" and res.num_tokens == length
    # A compressed token for every window, all checked against the reference.
    assert res.reports["c4_main_fp8"].compressed == length // 4
    assert res.reports["c128_main_fp8"].compressed == length // 128
    if length >= 4:
        assert res.reports["c4_main_fp8"].cache_bytes_checked > 0


@pytest.mark.slow
def test_prefill_every_length_in_ragged_batches(device):
    """Every prompt length 1..300 once, eight ragged prompts per prefill batch, each request
    then decoding a few steps next to the next batch's prompts."""
    sim = make_sim(device, max_requests=16, max_context=320)
    lengths = list(range(1, 301))
    previous = []
    for i in range(0, len(lengths), 8):
        for r in previous:
            sim.finish(r)
        batch = [(sim.add_request(), n) for n in lengths[i:i + 8]]
        step(sim, batch)
        previous = [r for r, _ in batch]
        decode_steps(sim, previous, 5)


@pytest.mark.slow
def test_prefill_then_decode_crossing_windows(device):
    """Two requests decode 300 steps from unaligned prefills: many cr=4 windows close by
    decode and the cr=128 windows at 256, 384 and 512 close by decode too."""
    sim = make_sim(device, max_context=640)
    a, b = sim.add_request("a"), sim.add_request("b")
    step(sim, [(a, 250), (b, 3)])
    closed = 0
    for _ in range(300):
        res = step(sim, [(a, 1), (b, 1)])
        closed += res.reports["c128_main_fp8"].compressed
    assert (a.seq_len, b.seq_len) == (550, 303)
    assert closed == 3 + 2          # a: 256, 384, 512; b: 128, 256


@pytest.mark.parametrize("c4_addr", ["swa_paged", "req_ring", "legacy"])
def test_decode_from_the_first_token(device, c4_addr):
    """Decode-only requests: the first cr=4 window (s = 4, no previous window) and the next
    ones close by decode; a request that prefilled 1..3 tokens joins the batch."""
    sim = make_sim(device, [idx(addressing=c4_addr), c4_main(addressing=c4_addr)],
                   max_context=64)
    a, b, c = (sim.add_request() for _ in range(3))
    step(sim, [(b, 1), (c, 3)])
    for _ in range(10):
        res = step(sim, [(a, 1), (b, 1), (c, 1)], "decode")
    assert res.kind == "decode" and (a.seq_len, b.seq_len, c.seq_len) == (10, 11, 13)


@pytest.mark.parametrize("prefix", [6, 120, 257])
def test_extend_after_unaligned_prefix(device, prefix):
    sim = make_sim(device, max_context=768)
    req = sim.add_request()
    step(sim, [(req, prefix)])
    for n in (1, 3, 130, 2):
        step(sim, [(req, n)], "extend")
    decode_steps(sim, [req], 6)
    step(sim, [(req, 131)], "extend")


def test_ragged_batches_with_zero_length_extends(device):
    sim = make_sim(device, max_requests=4, max_context=768)
    r = [sim.add_request() for _ in range(4)]
    step(sim, [(r[0], 0), (r[1], 5), (r[2], 130), (r[3], 0)])
    step(sim, [(r[0], 9), (r[1], 0), (r[2], 0), (r[3], 260)])
    step(sim, [(r[3], 0), (r[2], 3), (r[1], 123), (r[0], 119)])
    decode_steps(sim, r, 5)
    step(sim, [(r[1], 0), (r[2], 0)], "extend")            # nothing to do at all
    step(sim, [(r[2], 1), (r[0], 0), (r[3], 4)], "extend")
    sim.finish(r[1])
    late = sim.add_request()
    step(sim, [(late, 131), (r[0], 2)])
    decode_steps(sim, [late, r[0], r[2], r[3]], 9)


# ---------------------------------------------------------------------------------------
# Speculative decoding: verify steps (extends of width w <= pad), then keep k tokens
# ---------------------------------------------------------------------------------------
def _verify_round(sim, reqs, widths, keeps):
    prefixes = [r.seq_len for r in reqs]
    step(sim, list(zip(reqs, widths)), "verify")
    for r, p, k in zip(reqs, prefixes, keeps):
        sim.truncate(r, p + k)


def test_speculative_verify_cr4(device):
    """Ring 16 (pad 10) for cr=4: verify widths up to 10 with random acceptance."""
    sim = make_sim(device, [idx(), idx("fp4_indexer"), c4_main()], speculative=True,
                   max_context=512)
    assert {c.ring for c in sim.compressors} == {16} and {c.pad for c in sim.compressors} == {10}
    a, b = sim.add_request(), sim.add_request()
    step(sim, [(a, 21), (b, 6)])
    rounds = [((10, 10), (1, 10)), ((7, 3), (7, 1)), ((10, 4), (3, 4)), ((1, 10), (1, 2)),
              ((9, 2), (9, 2)), ((10, 10), (10, 1)), ((5, 8), (2, 8))]
    for widths, keeps in rounds * 3:
        _verify_round(sim, [a, b], widths, keeps)
        step(sim, [(a, 1), (b, 1)], "decode")


def test_speculative_verify_cr128(device):
    """Ring 256 (pad 130) for cr=128: verify widths up to 130 with random acceptance."""
    sim = make_sim(device, [c128_main(), c128_main("bf16")], speculative=True, max_context=1280)
    assert {c.pad for c in sim.compressors} == {130}
    a, b = sim.add_request(), sim.add_request()
    step(sim, [(a, 100), (b, 127)])
    rounds = [((130, 2), (1, 2)), ((130, 130), (129, 130)), ((64, 1), (64, 1)),
              ((3, 128), (2, 1)), ((130, 100), (130, 30)), ((128, 129), (7, 129))]
    for widths, keeps in rounds:
        _verify_round(sim, [a, b], widths, keeps)
        decode_steps(sim, [a, b], 2)


def test_speculative_verify_online(device):
    """The online cr=128 state with the draft ops (contract 10): verify widths 1..8, every accept
    length, chunks closing inside a verify, decode and extend steps after a verify, beside an
    offline c4 compressor; every step checked against the oracle (banks and committed slot)."""
    sim = make_sim(device, [c128_main(addressing="online"), idx(),
                            CompressorConfig(128, 512, "fp8_ds_mla", "online",
                                             state_dtype=torch.bfloat16,
                                             name="c128_online_bf16")],
                   speculative=True, max_context=1280)
    a, b = sim.add_request(), sim.add_request()
    step(sim, [(a, 120), (b, 3)])
    rng = random.Random(5)
    for i in range(14):
        d = rng.randint(1, 8)
        _verify_round(sim, [a, b], (d, d), (rng.randint(1, d), rng.randint(1, d)))
        if i % 5 == 4:
            step(sim, [(a, 1), (b, 1)], "decode")
        if i % 7 == 6:
            step(sim, [(a, 2), (b, 1)], "extend")
    with pytest.raises(ValueError, match="one width"):
        step(sim, [(a, 2), (b, 3)], "verify")
    step(sim, [(a, 3), (b, 3)], "verify")
    with pytest.raises(ValueError, match="carry every verified request"):
        step(sim, [(a, 1)], "decode")


def test_truncate_rules(device):
    sim = make_sim(device, [idx()], speculative=True, max_context=256)
    r = sim.add_request()
    step(sim, [(r, 40)])
    step(sim, [(r, 11)], "verify")
    with pytest.raises(ValueError, match="pad"):
        sim.truncate(r, 45)                     # width 11 > pad 10
    step(sim, [(r, 10)], "verify")
    with pytest.raises(ValueError, match="allowed"):
        sim.truncate(r, 51)                     # must keep the first verified token
    sim.truncate(r, 52)
    plain = make_sim(device, [idx()], max_context=64)
    q = plain.add_request()
    step(plain, [(q, 9)])
    with pytest.raises(ValueError, match="speculative"):
        plain.truncate(q, 8)


# ---------------------------------------------------------------------------------------
# Addressing, dtypes, stores
# ---------------------------------------------------------------------------------------
def _mixed_trace(sim, n_decode=40):
    """Prefill, decode across windows, extend unaligned, ragged multi-request batches."""
    a, b = sim.add_request("a"), sim.add_request("b")
    step(sim, [(a, 125), (b, 6)])
    decode_steps(sim, [a, b], n_decode)
    step(sim, [(a, 0), (b, 130)])
    step(sim, [(b, 2), (a, 93)])
    decode_steps(sim, [a, b], 5)
    return a, b


@pytest.mark.parametrize("c4_addr,c128_addr", [("swa_paged", "req_ring"), ("req_ring", "online"),
                                               ("legacy", "legacy")])
def test_addressing_modes(device, c4_addr, c128_addr):
    comps = [idx(addressing=c4_addr), c4_main(addressing=c4_addr),
             c128_main(addressing=c128_addr)]
    _mixed_trace(make_sim(device, comps, max_context=512))


@pytest.mark.parametrize("state_dtype,input_dtype", [(BF16, F32), (F32, BF16), (BF16, BF16)])
def test_state_and_input_dtypes(device, state_dtype, input_dtype):
    kw = dict(state_dtype=state_dtype, input_dtype=input_dtype)
    comps = all_compressors(**kw)
    _mixed_trace(make_sim(device, comps, max_context=512))


def test_bf16_store_and_output_dtypes(device):
    """bf16 cache store; fp32 output from bf16 input; bf16 ape; int32 out_loc."""
    comps = [c4_main("bf16"), c128_main("bf16"),
             CompressorConfig(4, 128, "fp4_indexer", name="idx_f32_out", input_dtype=BF16,
                              out_dtype=F32),
             CompressorConfig(128, 512, name="c128_bf16_ape", ape_dtype=BF16, state_dtype=BF16),
             CompressorConfig(4, 512, name="c4_bf16_out", input_dtype=F32, out_dtype=BF16)]
    _mixed_trace(make_sim(device, comps, max_context=512, out_loc_dtype=torch.int32))


def test_online_cr128_long_decode(device):
    """The online running state across chunk boundaries, by decode and by extends that start
    and stop inside a chunk (state merge)."""
    comps = [c128_main(addressing="online"),
             CompressorConfig(128, 512, addressing="online", name="online_bf16_in",
                              input_dtype=BF16),
             CompressorConfig(128, 512, addressing="online", name="online_bf16_state",
                              state_dtype=BF16),
             c128_main()]
    sim = make_sim(device, comps, max_context=700)
    a, b = sim.add_request(), sim.add_request()
    step(sim, [(a, 1), (b, 127)])
    decode_steps(sim, [a, b], 130)
    step(sim, [(a, 60), (b, 200)])
    step(sim, [(a, 140), (b, 1)])
    decode_steps(sim, [a, b], 3)


# ---------------------------------------------------------------------------------------
# CUDA-graph padding, device-side lengths, prefix sharing, SWA eviction
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("graph,on_device", [(True, False), (True, True), (False, True)])
def test_graph_padding_and_device_lengths(device, graph, on_device):
    comps = [idx(), c4_main(), c128_main(), c128_main(addressing="online"),
             CompressorConfig(4, 128, addressing="legacy", name="legacy4"),
             CompressorConfig(128, 512, "bf16", addressing="legacy", name="legacy128")]
    sim = make_sim(device, comps, use_cuda_graph=graph, lengths_on_device=on_device,
                   max_context=512)
    a, b, c = (sim.add_request() for _ in range(3))
    res = step(sim, [(a, 130), (b, 7), (c, 0)])
    if graph:  # plans padded past the real tokens: extra rows must come out as zeros
        assert res.outputs["c4_idx_fp8"].shape[0] > 137
    decode_steps(sim, [a, b, c][: 3 if c.seq_len else 2], 3)    # batch 2 (and 3 -> bucket 4)
    step(sim, [(c, 5), (a, 1), (b, 125)])
    decode_steps(sim, [a, b, c], 4)


def test_prefix_sharing_reads_the_band_rows(device):
    """A request reusing another's cached pages (prefix-cache hit) finds the overlap rows of
    its first cr=4 window in the last 4 rows of the shared SWA page (the planner's band rule)."""
    sim = make_sim(device, [idx(), c4_main(), c128_main()], page_size=128, swa_page_size=64,
                   max_context=768)
    parent = sim.add_request("parent")
    step(sim, [(parent, 300)])
    child = sim.add_request("child", prefix_from=parent, prefix_len=256)
    assert child.seq_len == 256
    step(sim, [(child, 9), (parent, 1)])      # child's first window reads parent's rows 252..255
    decode_steps(sim, [child, parent], 5)
    sim.finish(parent)
    step(sim, [(child, 130)])
    other = sim.add_request("other", prefix_from=child, prefix_len=384)
    step(sim, [(other, 4), (child, 3)])


def test_swa_eviction_and_page_reuse(device):
    """Old SWA pages are evicted and reused by other requests: stale ring rows in a reused
    page must never be read."""
    sim = make_sim(device, [idx(), c4_main(), c128_main()], swa_page_size=16, swa_window=40,
                   max_requests=3, max_context=512, num_swa_pages=30)
    a, b = sim.add_request(), sim.add_request()
    step(sim, [(a, 100), (b, 30)])
    decode_steps(sim, [a, b], 20)
    sim.finish(a)
    c = sim.add_request()
    step(sim, [(c, 90), (b, 17)])
    decode_steps(sim, [b, c], 12)
    sim.finish(b)
    d = sim.add_request()
    step(sim, [(d, 45), (c, 3)])
    decode_steps(sim, [c, d], 8)


# ---------------------------------------------------------------------------------------
# The harness itself: it must notice a wrong token, a stray byte, a stray state row
# ---------------------------------------------------------------------------------------
def _sabotaged(monkeypatch, fn_name, wrapper):
    real = getattr(simulate, fn_name)
    monkeypatch.setattr(simulate, fn_name, lambda *a, **k: wrapper(real, *a, **k))


FAULTS = {"token": "compressed token", "cache_byte": "changed outside the windows",
          "state_row": "persists nothing there", "lost_write": "should hold the row"}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_checker_catches_faults(device, monkeypatch, fault):
    sim = make_sim(device, [idx(), c128_main()], max_context=300)
    r = sim.add_request()
    step(sim, [(r, 130)])

    def step_op(real, state, inp, ape, plan, **kw):  # the simulator's compress_and_store
        if fault == "lost_write":
            saved = state.clone()
        real(state, inp, ape, plan, **kw)
        out, cr = kw["out"], kw["compress_ratio"]
        if fault == "token" and cr == 4 and bool(out[0].any()):
            out[0, 5] += 1e-3 * (1 + out[0, 5].abs())
        if fault == "state_row" and cr == 4:
            state.view(-1, state.shape[-1])[-1, 0] = 1.0
        if fault == "lost_write" and cr == 128:
            state.copy_(saved)
        if fault == "cache_byte" and cr == 4:
            kw["kvcache"][-1, -1] ^= 1
        return out

    _sabotaged(monkeypatch, "compress_and_store", step_op)
    with pytest.raises(SimulationMismatch, match=FAULTS[fault]):
        for _ in range(4):                       # 131..134: a cr=4 window closes at 132
            step(sim, [(r, 1)], "decode")


def test_demo_configuration_builds(device):
    comps = deepseek_v4_compressors(indexer_stores=("fp8_indexer", "fp4_indexer"))
    assert [c.name for c in comps] == ["c4_indexer_fp8", "c4_indexer_fp4", "c4_main", "c128_main"]
    sim = ServingSimulator(comps, device=device, max_requests=1, max_context=256)
    r = sim.add_request()
    assert sim.step([(r, 8)]).reports["c4_indexer_fp4"].compressed == 2


# ---------------------------------------------------------------------------------------
# Property test: random batches through chained prefill / extend / verify / decode steps
# ---------------------------------------------------------------------------------------
try:
    from hypothesis import HealthCheck, given, settings, strategies as st
except ImportError:  # pragma: no cover
    st = None

if st is not None:
    # Each variant: compressor factories (each draws its own state / input dtypes) and
    # whether its requests may share prefixes (cr=4 state through SWA pages only).
    VARIANTS = {
        "paged": ([lambda kw: idx(**kw), lambda kw: idx("fp4_indexer", **kw),
                   lambda kw: c4_main(**kw), lambda kw: c128_main(**kw)], True),
        "ring": ([lambda kw: idx(addressing="req_ring", **kw), lambda kw: c4_main("bf16", **kw),
                  lambda kw: c128_main("bf16", **kw)], False),
        "legacy_online": ([lambda kw: idx(addressing="legacy", **kw),
                           lambda kw: c128_main(addressing="online", **kw),
                           lambda kw: c128_main("bf16", addressing="legacy", **kw)], False),
    }
    DTYPES = st.sampled_from([F32, BF16])
    LENGTHS = st.one_of(st.integers(0, 12), st.integers(120, 140), st.integers(0, 300))

    @settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(data=st.data())
    def test_random_serving_trace(device, data):
        """Random ragged batches through chained prefill / extend / verify / decode steps,
        with requests joining, finishing and sharing prefixes; every step fully checked."""
        draw = data.draw
        variant = draw(st.sampled_from(sorted(VARIANTS)), "variant")
        factories, can_share = VARIANTS[variant]
        comps = [f(dict(state_dtype=draw(DTYPES, "state"), input_dtype=draw(DTYPES, "input")))
                 for f in factories]
        spec = variant != "legacy_online" and draw(st.booleans(), "speculative")
        evict = can_share and draw(st.booleans(), "evict")
        sps = draw(st.sampled_from([16, 64]), "swa_page_size")
        sim = ServingSimulator(
            comps, device=device, max_requests=4, max_context=700, page_size=128,
            swa_page_size=sps, speculative=spec, use_cuda_graph=draw(st.booleans(), "graph"),
            lengths_on_device=draw(st.booleans(), "device_lengths"),
            out_loc_dtype=draw(st.sampled_from([torch.int32, torch.int64]), "out_loc"),
            swa_window=sps + 40 if evict else None, seed=draw(st.integers(0, 2**16), "seed"))
        pad = min(c.pad for c in sim.compressors)
        live = [sim.add_request()]
        ops = st.sampled_from(["extend", "decode", "verify", "add", "finish", "share"])
        for _ in range(draw(st.integers(2, 12), "steps")):
            op = draw(ops, "op")
            if op in ("add", "share") and len(live) < 4:
                parents = [r for r in live if r.rollback_floor >= 128]
                if op == "share" and can_share and not evict and parents:
                    parent = draw(st.sampled_from(parents), "parent")
                    live.append(sim.add_request(prefix_from=parent,
                                                prefix_len=parent.rollback_floor // 128 * 128))
                else:
                    live.append(sim.add_request())
                continue
            if op == "finish" and len(live) > 1:
                sim.finish(live.pop(draw(st.integers(0, len(live) - 1), "victim")))
                continue
            room = {id(r): sim.max_context - r.seq_len for r in live}
            started = [r for r in live if r.seq_len and room[id(r)] >= max(pad, 1)]
            if op == "decode" and started:
                step(sim, [(r, 1) for r in started], "decode")
            elif op == "verify" and spec and started:
                widths = [draw(st.integers(1, pad), "width") for _ in started]
                keeps = [draw(st.integers(1, w), "keep") for w in widths]
                _verify_round(sim, started, widths, keeps)
            else:
                batch = [(r, min(draw(LENGTHS, "extend"), room[id(r)])) for r in live]
                step(sim, batch, "extend")
