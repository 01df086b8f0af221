"""torch.library.opcheck on every op: schema (mutation annotations, no aliasing), autograd
registration, fake tensor propagation and AOT dispatch with dynamic shapes."""
import pytest
import torch

import dsv4_ops

from op_samples import decode_world, make_world

OPS = torch.ops.dsv4


def _check(op, args):
    torch.library.opcheck(op, args)


@pytest.mark.parametrize("cr", [4, 128])
def test_planners(device, cr):
    w = make_world(device, compress_ratio=cr)
    _check(OPS.plan_decode, (w.rid, w.req_to_token, w.full_to_state, w.seq_lens, cr, 64, w.ring, False))
    _check(OPS.plan_decode_legacy, (w.rid, w.seq_lens, cr))
    _check(OPS.plan_prefill, (w.rid, w.seq_lens, w.extend_lens, w.req_to_token, w.full_to_state,
                              cr, 64, w.ring, w.num_q + 3, cr == 128))
    _check(OPS.plan_prefill_legacy, (w.rid, w.seq_lens, w.extend_lens, cr, w.num_q))
    if cr == 128:
        _check(OPS.plan_online_decode, (w.rid, w.seq_lens, 1))
        _check(OPS.plan_online_prefill, (w.rid, w.seq_lens, w.extend_lens, w.num_q, 1))


@pytest.mark.parametrize("cr,hd", [(4, 128), (128, 512)])
def test_compress_forward(device, cr, hd):
    w = make_world(device, compress_ratio=cr, head_dim=hd)
    plan = dsv4_ops.CompressorPrefillPlan.generate(
        cr, w.rid, w.seq_lens, w.extend_lens, w.req_to_token, w.full_to_state, 64, w.ring,
        w.num_q, use_cuda_graph=True)
    out = torch.empty((plan.plan_c.shape[0], hd), device=w.device)
    _check(OPS.compress_forward, (w.state, w.kv_in, w.ape, plan.plan_c, plan.plan_w, out, hd, cr, False))
    d = decode_world(device, compress_ratio=cr, head_dim=hd)
    dplan = dsv4_ops.CompressorDecodePlan.generate(cr, d.rid, d.req_to_token, d.full_to_state,
                                                   d.seq_lens, 64, d.ring)
    out = torch.empty((2, hd), device=d.device)
    _check(OPS.compress_forward, (d.state, d.kv_in, d.ape, dplan.plan_d, None, out, hd, cr, False))


def test_compress_forward_online(device):
    w = make_world(device, compress_ratio=128, head_dim=512)
    state = dsv4_ops.state_buffer(128, 512, 8, is_online=True, device=w.device)
    plan = dsv4_ops.CompressorPrefillPlan.generate_online(
        w.seq_lens, w.extend_lens, w.rid, w.req_to_token, w.num_q, use_cuda_graph=True)
    out = torch.empty((plan.plan_c.shape[0], 512), device=w.device)
    _check(OPS.compress_forward, (state, w.kv_in, w.ape, plan.plan_c, plan.plan_w, out, 512, 128, True))


@pytest.mark.parametrize("dcp", [False, True], ids=["one_rank", "dcp"])
@pytest.mark.parametrize("fmt", list(dsv4_ops.STORE_FORMATS))
def test_compress_norm_rope_store(device, fmt, dcp):
    hd = dsv4_ops.STORE_FORMATS[fmt].head_dim
    w = decode_world(device, compress_ratio=4, head_dim=hd)
    plan = dsv4_ops.CompressorDecodePlan.generate(4, w.rid, w.req_to_token, w.full_to_state,
                                                  w.seq_lens, 64, w.ring)
    kv = torch.randn((2, hd), device=w.device)
    # DCP (contract 9): 2 ranks, the one that owns row 0's entry (both rows close a window)
    extra = ("v4", 2, int(w.out_loc[0]) % 2, 1) if dcp else ()
    _check(OPS.compress_norm_rope_store, (kv, plan.plan_d, w.norm_weight, w.freqs_real, w.out_loc,
                                          w.kvcache(fmt), True, 4, 1e-6, w.cache_page_size, fmt)
           + extra)
