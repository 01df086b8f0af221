"""Bad input raises a clear error naming the op and the argument (and never crashes)."""
import re

import pytest
import torch

import dsv4_ops
from dsv4_ops import ops

from op_samples import decode_world, freqs_real, make_world

OPS = torch.ops.dsv4


def raises(op: str, arg: str, fn):
    with pytest.raises((RuntimeError, ValueError)) as info:
        fn()
    msg = str(info.value)
    assert f"dsv4.{op}" in msg, msg
    assert re.search(rf"\b{re.escape(arg)}\b", msg), msg


def _decode_args(w, **over):
    a = dict(req_pool_indices=w.rid, req_to_token=w.req_to_token, full_to_state=w.full_to_state,
             seq_lens=w.seq_lens, compress_ratio=w.compress_ratio, swa_page_size=64,
             ring_size=w.ring, use_req_ring=False)
    a.update(over)
    return lambda: ops.plan_decode(**a)


def _prefill_args(w, **over):
    a = dict(req_pool_indices=w.rid, seq_lens=w.seq_lens.cpu(), extend_lens=w.extend_lens.cpu(),
             req_to_token=w.req_to_token, full_to_state=w.full_to_state,
             compress_ratio=w.compress_ratio, swa_page_size=64, ring_size=w.ring,
             num_q_tokens=w.num_q, use_req_ring=False)
    a.update(over)
    return lambda: ops.plan_prefill(**a)


PLANNER_CASES = [
    ("compress_ratio", dict(compress_ratio=8)),
    ("req_pool_indices", dict(req_pool_indices="int32")),
    ("req_to_token", dict(req_to_token="int64")),
    ("full_to_state", dict(full_to_state="int32")),
    ("seq_lens", dict(seq_lens="2d")),
    ("ring_size", dict(ring_size=6)),
    ("swa_page_size", dict(swa_page_size=60)),
]


def _mutate(w, over):
    out = {}
    for k, v in over.items():
        t = getattr(w, {"req_pool_indices": "rid"}.get(k, k), None)
        if v == "int32":
            out[k] = t.to(torch.int32)
        elif v == "int64":
            out[k] = t.to(torch.int64)
        elif v == "2d":
            out[k] = t.view(1, -1)
        else:
            out[k] = v
    return out


@pytest.mark.parametrize("arg,over", PLANNER_CASES, ids=[c[0] for c in PLANNER_CASES])
def test_plan_decode_bad_input(device, arg, over):
    w = make_world(device)
    raises("plan_decode", arg, _decode_args(w, **_mutate(w, over)))


def test_plan_prefill_too_many_tokens(device):
    w = make_world(device)
    raises("plan_prefill", "num_q_tokens", _prefill_args(w, num_q_tokens=65537))


def test_plan_prefill_extend_longer_than_seq(device):
    w = make_world(device)
    raises("plan_prefill", "extend_lens",
           _prefill_args(w, extend_lens=w.seq_lens.cpu() + 1))


def test_plan_prefill_tokens_exceed_num_q(device):
    w = make_world(device)
    raises("plan_prefill", "num_q_tokens", _prefill_args(w, num_q_tokens=w.num_q - 1))


def _compress_call(w, **over):
    hd, cr = w.head_dim, w.compress_ratio
    plan = dsv4_ops.CompressorDecodePlan.generate(cr, w.rid, w.req_to_token, w.full_to_state,
                                                  w.seq_lens, 64, w.ring)
    a = dict(kv_score_buffer=w.state, kv_score_input=w.kv_in, ape=w.ape, plan=plan.plan_d,
             plan_w=None, out=torch.empty((2, hd), device=w.device), head_dim=hd,
             compress_ratio=cr, is_online=False)
    a.update(over)
    return lambda: ops.compress_forward_op(**a)


def test_compress_head_dim(device):
    w = decode_world(device)
    raises("compress_forward", "head_dim", _compress_call(w, head_dim=256))


def test_compress_state_dtype(device):
    w = decode_world(device)
    raises("compress_forward", "kv_score_buffer", _compress_call(w, kv_score_buffer=w.state.half()))


def test_compress_state_not_contiguous(device):
    w = decode_world(device)
    bad = torch.cat([w.state, w.state], dim=-1)[..., : w.state.shape[-1]]
    raises("compress_forward", "kv_score_buffer", _compress_call(w, kv_score_buffer=bad))


def test_compress_input_row_length(device):
    w = decode_world(device)
    raises("compress_forward", "kv_score_input", _compress_call(w, kv_score_input=w.kv_in[:, :-4].contiguous()))


def test_compress_ape_shape(device):
    w = decode_world(device)
    raises("compress_forward", "ape", _compress_call(w, ape=w.ape[:4].contiguous()))


def test_compress_plan_record_size(device):
    w = decode_world(device)
    raises("compress_forward", "plan", _compress_call(w, plan=torch.zeros((2, 8), dtype=torch.uint8, device=w.device)))


def test_compress_out_shape(device):
    w = decode_world(device)
    raises("compress_forward", "out", _compress_call(w, out=torch.empty((3, w.head_dim), device=w.device)))


def test_compress_ratio_mismatch_with_plan(device):
    w = decode_world(device)
    plan = dsv4_ops.CompressorDecodePlan.generate(4, w.rid, w.req_to_token, w.full_to_state,
                                                  w.seq_lens, 64, w.ring)
    raises("compress_forward", "compress_ratio",
           lambda: dsv4_ops.compress_forward(w.state, w.kv_in, w.ape, plan, head_dim=128, compress_ratio=128))


def _store_call(w, fmt="fp8_indexer", **over):
    plan = dsv4_ops.CompressorDecodePlan.generate(4, w.rid, w.req_to_token, w.full_to_state,
                                                  w.seq_lens, 64, w.ring)
    a = dict(kv=torch.randn((2, w.head_dim), device=w.device), plan=plan.plan_d,
             norm_weight=w.norm_weight, freqs=freqs_real(w), out_loc=w.out_loc(2),
             kvcache=w.kvcache(fmt), is_decode=True, compress_ratio=4, eps=1e-6,
             page_size=w.cache_page_size, store_format=fmt)
    a.update(over)
    return lambda: ops.compress_norm_rope_store_op(**a)


def test_store_page_size_not_power_of_two(device):
    w = decode_world(device)
    raises("compress_norm_rope_store", "page_size", _store_call(w, page_size=12))


def test_store_cache_dtype(device):
    w = decode_world(device)
    raises("compress_norm_rope_store", "kvcache", _store_call(w, kvcache=torch.zeros((8, 132 * 16), device=w.device)))


def test_store_cache_page_too_small(device):
    w = decode_world(device)
    raises("compress_norm_rope_store", "kvcache",
           _store_call(w, kvcache=torch.zeros((8, 100), dtype=torch.uint8, device=w.device)))


def test_store_freqs_shape(device):
    w = decode_world(device)
    raises("compress_norm_rope_store", "freqs", _store_call(w, freqs=freqs_real(w)[:, :32].contiguous()))


def test_store_out_loc_dtype(device):
    w = decode_world(device)
    raises("compress_norm_rope_store", "out_loc", _store_call(w, out_loc=w.out_loc(2).float()))


def test_store_kv_rows_differ_from_plan(device):
    w = decode_world(device)
    raises("compress_norm_rope_store", "kv", _store_call(w, kv=torch.randn((3, 128), device=w.device)))


def test_store_unknown_format(device):
    w = decode_world(device)
    raises("compress_norm_rope_store", "store_format", _store_call(w, store_format="fp6"))


def test_store_head_dim_without_format():
    with pytest.raises(ValueError, match=r"dsv4\.compress_norm_rope_store: kv\.shape\[1\] \(head_dim\)"):
        dsv4_ops.store_format_of(256)


def test_debug_mode_names_the_bad_record(device):
    w = decode_world(device)
    plan = dsv4_ops.CompressorDecodePlan.generate(4, w.rid, w.req_to_token, w.full_to_state,
                                                  w.seq_lens, 64, w.ring)
    bad = plan.plan_d.clone()
    bad.view(torch.int32)[1, 1] = 10 ** 6  # write_loc far past the state buffer
    bad_plan = dsv4_ops.CompressorDecodePlan(4, bad)
    with pytest.raises(ValueError, match=r"dsv4\.compress_forward: plan record 1 has write_loc"):
        dsv4_ops.validate_compress(bad_plan, w.state, w.kv_in)
    # Normal mode: the kernel skips the record instead of writing out of bounds.
    before = w.state.clone()
    dsv4_ops.compress_forward(w.state, w.kv_in, w.ape, bad_plan, head_dim=128, compress_ratio=4)
    slot0 = int(plan.plan_d.view(torch.int32)[0, 1])
    changed = (w.state.view(-1, w.state.shape[-1]) != before.view(-1, w.state.shape[-1])).any(-1)
    assert changed.nonzero().flatten().tolist() == [slot0]
