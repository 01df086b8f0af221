"""Bad input raises a clear error naming the op and the argument (and never crashes)."""
import re

import pytest
import torch

import dsv4_ops
from dsv4_ops import ops

from op_samples import decode_world, make_world

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


# Argument checks of the raw ops live beside their kernels' tests (test_compress.py
# test_argument_errors, test_store.py test_bad_arguments); here: the Python layer, the planners
# and debug mode.


def test_compress_ratio_mismatch_with_plan(device):
    w = decode_world(device)
    plan = dsv4_ops.CompressorDecodePlan.generate(4, w.rid, w.req_to_token, w.full_to_state,
                                                  w.seq_lens, 64, w.ring)
    raises("compress_forward", "compress_ratio",
           lambda: dsv4_ops.compress_forward(w.state, w.kv_in, w.ape, plan, head_dim=128, compress_ratio=128))


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
