"""torch.compile(fullgraph=True) of a whole compressor step (plan, compress_forward,
compress_norm_rope_store; or plan, compress_and_store) gives the same outputs, state and cache
bytes as eager, with static and dynamic shapes. (CUDA-graph variants run in tests/test_cuda_graph.py.)"""
import pytest
import torch

import dsv4_ops

from op_samples import decode_world, make_world

SPS = 64


def decode_step(state, kv_in, ape, rid, r2t, f2s, seq_lens, norm_w, freqs, out_loc, cache,
                cr: int, hd: int, ring: int, page_size: int, fmt_fp4: bool):
    plan = dsv4_ops.CompressorDecodePlan.generate(cr, rid, r2t, f2s, seq_lens, SPS, ring)
    kv = dsv4_ops.compress_forward(state, kv_in, ape, plan, head_dim=hd, compress_ratio=cr)
    dsv4_ops.compress_norm_rope_store(kv, plan, norm_weight=norm_w, norm_eps=1e-6, freq_cis=freqs,
                                      out_loc=out_loc, kvcache=cache, page_size=page_size,
                                      use_fp4=fmt_fp4)
    return kv


def prefill_step(state, kv_in, ape, rid, r2t, f2s, seq_lens, ext_lens, norm_w, freqs, out_loc,
                 cache, cr: int, hd: int, ring: int, page_size: int, num_q: int):
    plan = dsv4_ops.CompressorPrefillPlan.generate(cr, rid, seq_lens, ext_lens, r2t, f2s, SPS, ring,
                                                   num_q, use_cuda_graph=True)
    kv = dsv4_ops.compress_forward(state, kv_in, ape, plan, head_dim=hd, compress_ratio=cr)
    dsv4_ops.compress_norm_rope_store(kv, plan, norm_weight=norm_w, norm_eps=1e-6, freq_cis=freqs,
                                      out_loc=out_loc, kvcache=cache, page_size=page_size)
    return kv


def padded_prefill_args(w, pad: int = 5):
    """prefill_step's arguments for world w with num_q_tokens padded by `pad` rows, as under
    CUDA-graph capture (an fp8_ds_mla cache), and that num_q_tokens."""
    cache = w.kvcache("fp8_ds_mla", pages=64)
    num_q = w.num_q + pad
    kv_in = torch.cat([w.kv_in, torch.zeros_like(w.kv_in[:pad])])
    out_loc = torch.arange(num_q, dtype=torch.int64, device=w.device)
    return [w.state, kv_in, w.ape, w.rid, w.req_to_token, w.full_to_state, w.seq_lens,
            w.extend_lens, w.norm_weight, w.freqs, out_loc, cache], num_q


def assert_same_run(step, run, args, state_i, cache_i):
    """`run` (a compiled or exported form of `step`) and eager `step` on separate copies of the
    arguments: the same output, state buffer (args[state_i]) and cache bytes (args[cache_i])."""
    eager = [a.clone() for a in args]
    other = [a.clone() for a in args]
    out_e, out_o = step(*eager), run(*other)
    assert torch.equal(out_e, out_o)
    assert torch.equal(eager[state_i], other[state_i]), "state buffer differs"
    assert torch.equal(eager[cache_i], other[cache_i]), "cache bytes differ"
    assert bool((eager[cache_i] != 0).any()), "the step stored nothing: the test proves nothing"


def _compiled(fn, dynamic):
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, dynamic=dynamic)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("cr,hd,fp4", [(4, 128, True), (4, 128, False), (128, 512, False)])
def test_compiled_decode_step_equals_eager(device, dynamic, cr, hd, fp4):
    w = decode_world(device, compress_ratio=cr, head_dim=hd)
    fmt = dsv4_ops.store_format_of(hd, use_fp4=fp4)
    cache = w.kvcache(fmt)
    args = [w.state, w.kv_in, w.ape, w.rid, w.req_to_token, w.full_to_state, w.seq_lens,
            w.norm_weight, w.freqs, w.out_loc, cache]
    fn = lambda *a: decode_step(*a, cr=cr, hd=hd, ring=w.ring, page_size=w.cache_page_size,  # noqa: E731
                                fmt_fp4=fp4)
    assert_same_run(fn, _compiled(fn, dynamic), args, state_i=0, cache_i=10)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("cr,hd", [(4, 512), (128, 512)])
def test_compiled_prefill_step_equals_eager(device, dynamic, cr, hd):
    w = make_world(device, compress_ratio=cr, head_dim=hd)
    args, num_q = padded_prefill_args(w)
    fn = lambda *a: prefill_step(*a, cr=cr, hd=hd, ring=w.ring, page_size=w.cache_page_size,  # noqa: E731
                                 num_q=num_q)
    assert_same_run(fn, _compiled(fn, dynamic), args, state_i=0, cache_i=11)


def fused_decode_step(state, kv_in, ape, rid, r2t, f2s, seq_lens, norm_w, freqs, out_loc, cache,
                      cr: int, hd: int, ring: int, page_size: int, fmt_fp4: bool):
    plan = dsv4_ops.CompressorDecodePlan.generate(cr, rid, r2t, f2s, seq_lens, SPS, ring)
    out = kv_in.new_empty((kv_in.shape[0], hd))
    dsv4_ops.compress_and_store(state, kv_in, ape, plan, head_dim=hd, compress_ratio=cr,
                                norm_weight=norm_w, norm_eps=1e-6, freq_cis=freqs,
                                out_loc=out_loc, kvcache=cache, page_size=page_size,
                                use_fp4=fmt_fp4, out=out)
    return out


def fused_prefill_step(state, kv_in, ape, rid, r2t, f2s, seq_lens, ext_lens, norm_w, freqs,
                       out_loc, cache, cr: int, hd: int, ring: int, page_size: int, num_q: int):
    plan = dsv4_ops.CompressorPrefillPlan.generate(cr, rid, seq_lens, ext_lens, r2t, f2s, SPS, ring,
                                                   num_q, use_cuda_graph=True)
    # without `out`: the step returns a copy of the state it wrote
    dsv4_ops.compress_and_store(state, kv_in, ape, plan, head_dim=hd, compress_ratio=cr,
                                norm_weight=norm_w, norm_eps=1e-6, freq_cis=freqs,
                                out_loc=out_loc, kvcache=cache, page_size=page_size)
    return state.clone()


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("cr,hd,fp4", [(4, 128, True), (128, 512, False)])
def test_compiled_fused_decode_step_equals_eager(device, dynamic, cr, hd, fp4):
    w = decode_world(device, compress_ratio=cr, head_dim=hd)
    cache = w.kvcache(dsv4_ops.store_format_of(hd, use_fp4=fp4))
    args = [w.state, w.kv_in, w.ape, w.rid, w.req_to_token, w.full_to_state, w.seq_lens,
            w.norm_weight, w.freqs, w.out_loc, cache]
    fn = lambda *a: fused_decode_step(*a, cr=cr, hd=hd, ring=w.ring,  # noqa: E731
                                      page_size=w.cache_page_size, fmt_fp4=fp4)
    assert_same_run(fn, _compiled(fn, dynamic), args, state_i=0, cache_i=10)


@pytest.mark.parametrize("dynamic", [False, True])
def test_compiled_fused_prefill_step_equals_eager(device, dynamic):
    w = make_world(device, compress_ratio=4, head_dim=512)
    args, num_q = padded_prefill_args(w)
    fn = lambda *a: fused_prefill_step(*a, cr=4, hd=512, ring=w.ring,  # noqa: E731
                                       page_size=w.cache_page_size, num_q=num_q)
    assert_same_run(fn, _compiled(fn, dynamic), args, state_i=0, cache_i=11)
