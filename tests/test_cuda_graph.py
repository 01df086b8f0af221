"""CUDA only: a whole compressor step captured in a CUDA graph and replayed after the
contents of seq_lens / req_pool_indices / out_loc / inputs change gives the same bytes as
eager; torch.compile(mode="reduce-overhead") equals eager; ops on a second GPU work while
the current device is another one."""
import pytest
import torch

import dsv4_ops

from op_samples import decode_world, make_world

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SPS = 64


def _decode(w, kv_in, rid, seq_lens, out_loc, cache, fmt_fp4=False):
    cr, hd = w.compress_ratio, w.head_dim
    plan = dsv4_ops.CompressorDecodePlan.generate(cr, rid, w.req_to_token, w.full_to_state,
                                                  seq_lens, SPS, w.ring)
    kv = dsv4_ops.compress_forward(w.state, kv_in, w.ape, plan, head_dim=hd, compress_ratio=cr)
    dsv4_ops.compress_norm_rope_store(kv, plan, norm_weight=w.norm_weight, norm_eps=1e-6,
                                      freq_cis=w.freqs, out_loc=out_loc, kvcache=cache,
                                      page_size=w.cache_page_size, use_fp4=fmt_fp4)
    return kv


def _capture(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    return g, out


def test_decode_step_graph_replay_matches_eager():
    dev = torch.device("cuda")
    w4 = decode_world(dev, compress_ratio=4, head_dim=128)      # indexer
    w128 = decode_world(dev, compress_ratio=128, head_dim=512)  # main
    c4, c128 = w4.kvcache("fp4_indexer"), w128.kvcache("fp8_ds_mla")
    static = dict(rid=w4.rid.clone(), seq4=w4.seq_lens.clone(), seq128=w128.seq_lens.clone(),
                  loc=w4.out_loc.clone(), x4=w4.kv_in.clone(), x128=w128.kv_in.clone())

    def step():
        a = _decode(w4, static["x4"], static["rid"], static["seq4"], static["loc"], c4, fmt_fp4=True)
        b = _decode(w128, static["x128"], static["rid"], static["seq128"], static["loc"], c128)
        return a, b

    g, (out4, out128) = _capture(step)
    gen = torch.Generator(device=dev).manual_seed(1)
    for it in range(3):
        # New contents for the next step: swapped requests, advanced lengths, new slots.
        static["rid"].copy_(static["rid"].flip(0))
        static["seq4"].add_(4 * (it + 1))
        static["seq128"].add_(128)
        static["loc"].copy_(torch.randperm(8 * w4.cache_page_size, device=dev, generator=gen)[:2])
        static["x4"].normal_(generator=gen)
        static["x128"].normal_(generator=gen)
        snapshot = [t.clone() for t in (w4.state, w128.state, c4, c128)]
        g.replay()
        replayed = [t.clone() for t in (w4.state, w128.state, c4, c128, out4, out128)]
        for t, s in zip((w4.state, w128.state, c4, c128), snapshot):
            t.copy_(s)
        e4, e128 = step()
        eager = [w4.state, w128.state, c4, c128, e4, e128]
        for name, r, e in zip(["state4", "state128", "cache4", "cache128", "out4", "out128"], replayed, eager):
            assert torch.equal(r, e), f"replay {it}: {name} differs from eager"
        assert bool((out128 != 0).any()) and bool((out4 != 0).any())


def test_device_lengths_prefill_graph_replay_matches_eager():
    dev = torch.device("cuda")
    w = make_world(dev, compress_ratio=4, head_dim=512)
    num_q = 64  # padded capture size
    cache = w.kvcache("fp8_ds_mla", pages=64)
    seq, ext = w.seq_lens.clone(), w.extend_lens.clone()
    kv_in = torch.zeros((num_q, w.kv_in.shape[1]), device=dev)
    out_loc = torch.arange(num_q, dtype=torch.int64, device=dev)

    def step():
        plan = dsv4_ops.CompressorPrefillPlan.generate(4, w.rid, seq, ext, w.req_to_token,
                                                       w.full_to_state, SPS, w.ring, num_q,
                                                       use_cuda_graph=True)
        kv = dsv4_ops.compress_forward(w.state, kv_in, w.ape, plan, head_dim=512, compress_ratio=4)
        dsv4_ops.compress_norm_rope_store(kv, plan, norm_weight=w.norm_weight, norm_eps=1e-6,
                                          freq_cis=w.freqs, out_loc=out_loc, kvcache=cache,
                                          page_size=w.cache_page_size)
        return kv

    g, out = _capture(step)
    gen = torch.Generator(device=dev).manual_seed(2)
    for new_seq, new_ext in (([20, 33], [7, 24]), ([40, 12], [20, 12]), ([8, 0 + 9], [8, 0])):
        seq.copy_(torch.tensor(new_seq, device=dev))
        ext.copy_(torch.tensor(new_ext, device=dev))
        kv_in.normal_(generator=gen)
        out_loc.copy_(torch.randperm(64 * w.cache_page_size, device=dev, generator=gen)[:num_q])
        snapshot = (w.state.clone(), cache.clone())
        g.replay()
        replayed = (w.state.clone(), cache.clone(), out.clone())
        w.state.copy_(snapshot[0])
        cache.copy_(snapshot[1])
        eager = step()
        assert torch.equal(replayed[0], w.state)
        assert torch.equal(replayed[1], cache)
        assert torch.equal(replayed[2], eager)


def test_reduce_overhead_compile_matches_eager():
    dev = torch.device("cuda")
    w = decode_world(dev, compress_ratio=4, head_dim=128)
    cache = w.kvcache("fp8_indexer")
    loc = w.out_loc

    def step(state, kv_in, seq_lens, cache):
        plan = dsv4_ops.CompressorDecodePlan.generate(4, w.rid, w.req_to_token, w.full_to_state,
                                                      seq_lens, SPS, w.ring)
        kv = dsv4_ops.compress_forward(state, kv_in, w.ape, plan, head_dim=128, compress_ratio=4)
        dsv4_ops.compress_norm_rope_store(kv, plan, norm_weight=w.norm_weight, norm_eps=1e-6,
                                          freq_cis=w.freqs, out_loc=loc, kvcache=cache,
                                          page_size=w.cache_page_size)
        return kv.clone()

    torch._dynamo.reset()
    compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
    se, ce = w.state.clone(), cache.clone()
    sc, cc = w.state.clone(), cache.clone()
    for _ in range(3):
        ke = step(se, w.kv_in, w.seq_lens, ce)
        kc = compiled(sc, w.kv_in, w.seq_lens, cc)
        assert torch.equal(ke, kc)
        assert torch.equal(se, sc) and torch.equal(ce, cc)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_ops_on_second_gpu_while_current_is_first():
    torch.cuda.set_device(0)
    ref_dev, dev = torch.device("cpu"), torch.device("cuda:1")
    results = []
    for d in (ref_dev, dev):
        w = decode_world(d, compress_ratio=4, head_dim=128)
        cache = w.kvcache("fp8_indexer")
        kv = _decode(w, w.kv_in, w.rid, w.seq_lens, w.out_loc, cache)
        results.append((kv.cpu(), w.state.cpu(), cache.cpu()))
    assert torch.cuda.current_device() == 0
    (k0, s0, c0), (k1, s1, c1) = results
    torch.testing.assert_close(k1, k0, rtol=1e-5, atol=1e-5)
    assert torch.equal(s0, s1)
    mism = (c0 != c1).float().mean().item()
    assert mism <= 0.001


def test_fused_steps_graph_replay_matches_eager():
    """compress_and_store (contract 11) captured in one graph for the four decode kernels (c4
    indexer fp4 without `out`, c4 main, c128 main with `out`, online c128) and a padded c4
    prefill, replayed after the plan contents, inputs and slots change: the bytes of eager."""
    from op_samples import fused_samples

    dev = torch.device("cuda", 0)
    samples = fused_samples(dev)
    names = ["decode_c4_fp4", "decode_c4_dcp", "decode_c128_out", "decode_online_v41",
             "prefill_c4"]
    args = {n: list(samples[n][1]) for n in names}
    op = torch.ops.dsv4.compress_and_store

    def step():
        for n in names:
            op(*args[n])

    def mutated(n):  # kv_score_buffer, kvcache, out
        return [t for t in (args[n][0], args[n][8], args[n][9]) if t is not None]

    g, _ = _capture(step)
    gen = torch.Generator(device=dev).manual_seed(3)
    for it in range(3):
        for n in names:
            a = args[n]
            a[1].normal_(generator=gen)                       # kv_score_input
            if a[4] is None:                                  # decode: the records swapped
                a[3].copy_(a[3].flip(0))
            a[7].copy_(torch.randperm(a[8].shape[0] * a[14], device=dev,
                                      generator=gen)[:a[7].shape[0]].to(a[7].dtype))
        snapshot = {n: [t.clone() for t in mutated(n)] for n in names}
        g.replay()
        replayed = {n: [t.clone() for t in mutated(n)] for n in names}
        for n in names:
            for t, s in zip(mutated(n), snapshot[n]):
                t.copy_(s)
        step()
        for n in names:
            for i, (r, e) in enumerate(zip(replayed[n], mutated(n))):
                assert torch.equal(r, e), f"replay {it}: {n} tensor {i} differs from eager"
