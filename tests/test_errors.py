"""Bad input raises a clear error naming the op and the argument (and never crashes)."""
import dataclasses
import re

import pytest
import torch

import dsv4_ops
from dsv4_ops import ops

from op_samples import decode_world, make_world

OPS = torch.ops.dsv4


def raises(op: str, arg: str, fn, error=(RuntimeError, ValueError)):
    """fn() raises `error` with a message naming the op (dsv4.<op>) and the argument."""
    with pytest.raises(error) as info:
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


# ---- bad input a new user would pass --------------------------------------------------------

def raises_type(op: str, arg: str, fn):
    raises(op, arg, fn, TypeError)


def _decode_plan(w, **over):
    a = dict(compress_ratio=w.compress_ratio, req_pool_indices=w.rid, req_to_token=w.req_to_token,
             full_to_state=w.full_to_state, seq_lens=w.seq_lens, swa_page_size=64,
             ring_size=w.ring)
    a.update(over)
    return dsv4_ops.CompressorDecodePlan.generate(**a)


def _prefill_plan(w, **over):
    a = dict(compress_ratio=w.compress_ratio, req_pool_indices=w.rid, seq_lens=w.seq_lens,
             extend_lens=w.extend_lens, req_to_token=w.req_to_token,
             full_to_state=w.full_to_state, swa_page_size=64, ring_size=w.ring,
             num_q_tokens=w.num_q)
    a.update(over)
    return dsv4_ops.CompressorPrefillPlan.generate(**a)


def test_swa_ring_shorter_than_window(device):
    """SWA-paged cr = 4 with a ring of 4 (< the 8-row window) would overwrite rows the window
    still reads; the request-ring path already refuses it."""
    w = make_world(device)
    raises("plan_decode", "ring_size", _decode_args(w, ring_size=4))
    raises("plan_prefill", "ring_size", _prefill_args(w, ring_size=4))
    raises("plan_decode", "ring_size", _decode_args(w, ring_size=4, use_req_ring=True))


def _shifted_swa_world(device, shift):
    """full_to_state moved by `shift` SWA rows: still a bijection, but not page-aligned
    (swa % 64 != pos % 64) when shift is not a multiple of the SWA page size."""
    return _with_full_to_state_shift(make_world(device), shift)


def _with_full_to_state_shift(w, shift):
    return dataclasses.replace(w, full_to_state_cpu=w.full_to_state_cpu + shift, tensors={})


@pytest.mark.parametrize("shift", [1, 8])
def test_debug_swa_pages_not_page_aligned(device, debug_mode, shift):
    w = _shifted_swa_world(device, shift)
    with pytest.raises(ValueError, match=r"dsv4\.plan_prefill: full_to_state is not page-aligned"):
        _prefill_plan(w)
    d = _with_full_to_state_shift(decode_world(device), shift)
    with pytest.raises(ValueError, match=r"dsv4\.plan_decode: full_to_state is not page-aligned"):
        _decode_plan(d)


def test_debug_swa_pages_split_across_pages(device, debug_mode):
    """Each position aligned (swa % 64 == pos % 64), but one 64-position block split over two
    SWA pages: the window's rows land on different state pages."""
    w = make_world(device)
    r2t = w.req_to_token.clone()
    rid, pos = int(w.rid[0]), 5  # request 0 (13 tokens) reads positions 0..12
    full = int(r2t[rid, pos])
    r2t[rid, pos] = int(r2t[int(w.rid[1]), pos])  # same offset in another full (and SWA) page
    assert full != int(r2t[rid, pos])
    with pytest.raises(ValueError, match=r"dsv4\.plan_prefill: full_to_state is not page-aligned"):
        _prefill_plan(w, req_to_token=r2t)


def test_debug_swa_tables_of_legal_worlds_pass(device, debug_mode):
    """No false alarm: page-aligned tables with evicted entries plan as in normal mode."""
    w = make_world(device)
    f2s = w.full_to_state.clone()
    f2s[::3] = -1
    ref = _prefill_plan(w, full_to_state=f2s)
    d = decode_world(device)
    dref = _decode_plan(d, full_to_state=f2s)
    dsv4_ops.set_debug(False)
    assert torch.equal(_prefill_plan(w, full_to_state=f2s).plan_c, ref.plan_c)
    assert torch.equal(_decode_plan(d, full_to_state=f2s).plan_d, dref.plan_d)


NON_INTEGER = [torch.float32, torch.float64, torch.bool]


@pytest.mark.parametrize("dtype", NON_INTEGER, ids=str)
def test_non_integer_lengths_and_indices(device, dtype):
    """8.7 must not silently become 8: the plan classes refuse float / bool index tensors."""
    w = make_world(device)
    d = decode_world(device)
    f = lambda t: t.to(dtype) + 0.7 if dtype.is_floating_point else t.to(dtype)  # noqa: E731
    raises_type("plan_decode", "seq_lens", lambda: _decode_plan(d, seq_lens=f(d.seq_lens)))
    raises_type("plan_decode", "req_pool_indices",
                lambda: _decode_plan(d, req_pool_indices=f(d.rid)))
    raises_type("plan_prefill", "seq_lens", lambda: _prefill_plan(w, seq_lens=f(w.seq_lens)))
    raises_type("plan_prefill", "extend_lens",
                lambda: _prefill_plan(w, extend_lens=f(w.extend_lens)))
    raises_type("plan_prefill", "req_pool_indices",
                lambda: _prefill_plan(w, req_pool_indices=f(w.rid)))
    raises_type("plan_decode_legacy", "seq_lens", lambda: dsv4_ops.CompressorDecodePlan.generate_legacy(
        4, w.rid, f(w.seq_lens)))
    raises_type("plan_prefill_legacy", "extend_lens",
                lambda: dsv4_ops.CompressorPrefillPlan.generate_legacy(
                    4, w.rid, w.seq_lens, f(w.extend_lens), w.num_q, device))
    raises_type("plan_online_decode", "seq_lens", lambda: dsv4_ops.CompressorDecodePlan.generate_online(
        f(w.seq_lens), w.rid, w.req_to_token))
    raises_type("plan_online_prefill", "req_pool_indices",
                lambda: dsv4_ops.CompressorPrefillPlan.generate_online(
                    w.seq_lens, w.extend_lens, f(w.rid), w.req_to_token, w.num_q))
    # the tables and out_loc go to the ops unconverted: the ops refuse them
    raises("plan_prefill", "req_to_token", lambda: _prefill_plan(w, req_to_token=f(w.req_to_token)))
    raises("plan_prefill", "full_to_state", lambda: _prefill_plan(w, full_to_state=f(w.full_to_state)))
    plan = _decode_plan(d)
    raises("compress_norm_rope_store", "out_loc", lambda: dsv4_ops.compress_norm_rope_store(
        torch.randn(2, 128, device=device), plan, norm_weight=d.norm_weight, norm_eps=1e-6,
        freq_cis=d.freqs, out_loc=f(d.out_loc), kvcache=d.kvcache("fp8_indexer"),
        page_size=d.cache_page_size))


def test_integer_lengths_of_other_widths_still_plan(device):
    w = make_world(device)
    ref = _prefill_plan(w)
    got = _prefill_plan(w, seq_lens=w.seq_lens.to(torch.int32), extend_lens=w.extend_lens.to(torch.int32),
                        req_pool_indices=w.rid.to(torch.int32))
    assert torch.equal(got.plan_c, ref.plan_c) and torch.equal(got.plan_w, ref.plan_w)


def _store_call(w, plan_obj, fmt="fp8_indexer", **over):
    hd = 512 if fmt in ("fp8_ds_mla", "bf16") else 128
    a = dict(kv=torch.randn(plan_obj[1].shape[0], hd, device=w.device), plan=plan_obj,
             norm_weight=w.norm_weight if hd == 128 else torch.ones(hd, device=w.device),
             norm_eps=1e-6, freq_cis=w.freqs, out_loc=w.out_loc,
             kvcache=w.kvcache(fmt), page_size=w.cache_page_size,
             use_fp4=fmt == "fp4_indexer", bf16_store=fmt == "bf16")
    a.update(over)
    return lambda: dsv4_ops.compress_norm_rope_store(**a)


def _raw_store_args(w, plan_rows, is_decode, **over):
    a = dict(kv=torch.randn(plan_rows.shape[0], 128, device=w.device), plan=plan_rows,
             norm_weight=w.norm_weight, freqs=w.freqs_real, out_loc=w.out_loc,
             kvcache=w.kvcache("fp8_indexer"), is_decode=is_decode, compress_ratio=w.compress_ratio,
             eps=1e-6, page_size=w.cache_page_size, store_format="fp8_indexer")
    a.update(over)
    return a


def test_debug_rope_table_shorter_than_positions(device, debug_mode):
    """Positions are device data: in normal mode rows past the table store nothing; debug mode
    names the record, through the raw op too."""
    d = decode_world(device)
    plan = _decode_plan(d)  # closing positions 12 and 4
    short = d.freqs[:10]
    with pytest.raises(ValueError, match=r"dsv4\.compress_norm_rope_store: plan record 0 has "
                                         r"rope position .*freq_cis"):
        _store_call(d, plan, freq_cis=short)()
    loc = torch.tensor([0, 3 * d.cache_page_size], dtype=torch.int64, device=device)
    a = _raw_store_args(d, plan.plan_d, True, freqs=d.freqs_real[:10].contiguous(), out_loc=loc)
    with pytest.raises(ValueError, match=r"dsv4\.compress_norm_rope_store: plan record 0 has "
                                         r"rope position"):
        ops.compress_norm_rope_store_op(**a)
    dsv4_ops.set_debug(False)
    cache = a["kvcache"]
    ops.compress_norm_rope_store_op(**a)  # row 0 (position 12) skipped, row 1 (position 4) stored
    assert (cache != 0).any(-1).nonzero().flatten().tolist() == [3]


@pytest.mark.parametrize("fmt", tuple(dsv4_ops.STORE_FORMATS))
def test_page_size_smaller_than_the_caches(device, fmt):
    """A cache built for page_size 64 written with page_size 32 would put every token at the
    offsets of a 32-token page: refused (a page may be padded by less than a doubling)."""
    d = decode_world(device)
    plan = _decode_plan(d)
    cache = torch.zeros((8, dsv4_ops.cache_page_bytes(fmt, 64)), dtype=torch.uint8, device=device)
    raises("compress_norm_rope_store", "page_size", _store_call(d, plan, fmt, kvcache=cache, page_size=32))
    padded = torch.zeros((8, dsv4_ops.cache_page_bytes(fmt, 64) + 64), dtype=torch.uint8,
                         device=device)
    _store_call(d, plan, fmt, kvcache=padded, page_size=64)()  # padding within a doubling


def test_fakes_check_devices_like_the_kernels():
    """Meta tensors mixed with CPU tensors dispatch to the fakes: they must refuse the call as
    the kernels refuse mixed devices (compress_forward once returned uninitialised memory)."""
    w = decode_world("cpu")
    plan = _decode_plan(w)
    meta_state = w.state.to("meta")
    raises("compress_forward", "kv_score_input", lambda: dsv4_ops.compress_forward(
        meta_state, w.kv_in, w.ape, plan, head_dim=128, compress_ratio=4))
    raises("compress_forward", "plan", lambda: dsv4_ops.compress_forward(
        meta_state, w.kv_in.to("meta"), w.ape.to("meta"), plan, head_dim=128, compress_ratio=4))
    raises("compress_norm_rope_store", "kv", _store_call(
        w, plan, kvcache=w.kvcache("fp8_indexer").to("meta")))
    raises("plan_decode", "req_to_token", lambda: ops.plan_decode(
        w.rid.to("meta"), w.req_to_token, w.full_to_state.to("meta"), w.seq_lens.to("meta"), 4,
        64, 8))
    raises("plan_prefill", "full_to_state", lambda: ops.plan_prefill(
        w.rid.to("meta"), w.seq_lens, w.extend_lens, w.req_to_token.to("meta"), w.full_to_state,
        4, 64, 8, 4))


META_CASES = [
    ("ape", lambda a: a.update(ape=a["ape"][:4])),
    ("out", lambda a: a.update(out=torch.empty(3, 128, device="meta"))),
    ("kv_score_buffer", lambda a: a.update(kv_score_buffer=a["kv_score_buffer"][..., :64])),
    ("compress_ratio", lambda a: a.update(compress_ratio=8)),
]


@pytest.mark.parametrize("arg,change", META_CASES, ids=[c[0] for c in META_CASES])
def test_fake_compress_forward_checks_shapes(arg, change):
    w = decode_world("cpu")
    plan = _decode_plan(w)
    a = dict(kv_score_buffer=w.state.to("meta"), kv_score_input=w.kv_in.to("meta"),
             ape=w.ape.to("meta"), plan=plan.plan_d.to("meta"), plan_w=None,
             out=torch.empty(2, 128, device="meta"), head_dim=128, compress_ratio=4,
             is_online=False)
    ops.compress_forward_op(**a)
    change(a)
    raises("compress_forward", arg, lambda: ops.compress_forward_op(**a))


def test_fake_store_and_planner_checks():
    w = decode_world("cpu")
    plan = _decode_plan(w)
    a = {k: (v.to("meta") if isinstance(v, torch.Tensor) else v)
         for k, v in _raw_store_args(w, plan.plan_d, True).items()}
    ops.compress_norm_rope_store_op(**a)
    for arg, change in [("page_size", dict(page_size=32)), ("eps", dict(eps=-1.0)),
                        ("freqs", dict(freqs=a["freqs"][:, :32])),
                        ("store_format", dict(store_format="fp8")),
                        ("plan", dict(plan=a["plan"][:1]))]:
        raises("compress_norm_rope_store", arg,
               lambda: ops.compress_norm_rope_store_op(**{**a, **change}))
    m = {k: getattr(w, k).to("meta") for k in ("rid", "req_to_token", "full_to_state", "seq_lens")}
    raises("plan_decode", "ring_size", lambda: ops.plan_decode(
        m["rid"], m["req_to_token"], m["full_to_state"], m["seq_lens"], 4, 64, 4))
    raises("plan_decode", "seq_lens", lambda: ops.plan_decode(
        m["rid"], m["req_to_token"], m["full_to_state"], m["seq_lens"].float(), 4, 64, 8))
    raises("plan_prefill", "num_q_tokens", lambda: ops.plan_prefill(
        m["rid"], w.seq_lens, w.extend_lens, m["req_to_token"], m["full_to_state"], 4, 64, 8,
        65537))


def test_out_aliasing_the_state_buffer(device):
    w = decode_world(device)
    plan = _decode_plan(w)
    alias = w.state.view(-1)[: 2 * 128].view(2, 128)
    raises("compress_forward", "out", lambda: dsv4_ops.compress_forward(
        w.state, w.kv_in, w.ape, plan, head_dim=128, compress_ratio=4, out=alias))
    inp = w.kv_in.view(-1)[: 2 * 128].view(2, 128)
    raises("compress_forward", "kv_score_input", lambda: dsv4_ops.compress_forward(
        w.state, w.kv_in, w.ape, plan, head_dim=128, compress_ratio=4, out=inp))


def test_requires_grad_inputs(device):
    """No autograd: a grad-requiring input under grad mode is an error that says so; the same
    tensors under torch.no_grad() are fine (parameters at inference)."""
    w = decode_world(device)
    plan = _decode_plan(w)
    ape = w.ape.clone().requires_grad_()
    kv_in = w.kv_in.clone().requires_grad_()
    for arg, call in [
        ("ape", lambda: dsv4_ops.compress_forward(w.state, w.kv_in, ape, plan, head_dim=128,
                                                  compress_ratio=4)),
        ("kv_score_input", lambda: dsv4_ops.compress_forward(w.state, kv_in, w.ape, plan,
                                                             head_dim=128, compress_ratio=4)),
        ("norm_weight", _store_call(w, plan, norm_weight=w.norm_weight.clone().requires_grad_())),
        ("kv", _store_call(w, plan, kv=torch.randn(2, 128, device=device, requires_grad=True))),
    ]:
        with pytest.raises(RuntimeError, match=rf"dsv4\.\w+: {arg} requires grad.*no autograd"):
            call()
        with torch.no_grad():
            call()


@pytest.mark.parametrize("eps", [-1e-6, float("nan"), float("inf")])
def test_bad_norm_eps(device, eps):
    w = decode_world(device)
    plan = _decode_plan(w)
    raises("compress_norm_rope_store", "norm_eps", _store_call(w, plan, norm_eps=eps))
    raises("compress_norm_rope_store", "eps",
           lambda: ops.compress_norm_rope_store_op(**_raw_store_args(w, plan.plan_d, True, eps=eps)))


def test_debug_plan_kind_and_ratio_mismatch(device, debug_mode):
    """A decode plan passed as prefill, a prefill plan as decode, or a plan made for another
    compress ratio: the raw ops cannot tell by shape; debug mode names the record."""
    d = decode_world(device)
    dplan = _decode_plan(d)
    with pytest.raises(ValueError, match=r"dsv4\.compress_norm_rope_store: plan record \d+ "):
        ops.compress_norm_rope_store_op(**_raw_store_args(d, dplan.plan_d, False))
    steps = _decode_plan(d, seq_lens=d.seq_lens - 1)  # tokens that close no window
    with pytest.raises(ValueError, match=r"dsv4\.compress_norm_rope_store: plan record 0 is not "
                                         r"a prefill"):
        ops.compress_norm_rope_store_op(**_raw_store_args(d, steps.plan_d, False))
    w = make_world(device)
    pplan = _prefill_plan(w, use_cuda_graph=True)
    n = pplan.plan_c.shape[0]
    a = _raw_store_args(w, pplan.plan_c, True)
    with pytest.raises(ValueError, match=r"dsv4\.compress_norm_rope_store: plan record \d+ is not "
                                         r"a decode"):
        ops.compress_norm_rope_store_op(**a)
    out = torch.empty(n, 128, device=device)
    assert w.kv_in.shape[0] == n  # the raw op's row-count check cannot tell
    with pytest.raises(ValueError, match=r"dsv4\.compress_forward: plan record"):
        ops.compress_forward_op(w.state, w.kv_in, w.ape, pplan.plan_c, None, out, 128, 4)
    # a cr = 4 decode plan used with compress_ratio 128 (buffers of the cr = 128 world)
    d128 = decode_world(device, compress_ratio=128, head_dim=128)
    with pytest.raises(ValueError, match=r"dsv4\.compress_forward: plan record \d+ is not a "
                                         r"decode record for compress_ratio 128"):
        ops.compress_forward_op(d128.state, d128.kv_in, d128.ape, dplan.plan_d, None,
                                torch.empty(2, 128, device=device), 128, 128)
    # an online decode plan used offline
    online = dsv4_ops.CompressorDecodePlan.generate_online(d128.seq_lens, d128.rid, d128.req_to_token)
    state128 = torch.zeros(d128.state.shape, device=device)
    with pytest.raises(ValueError, match=r"dsv4\.compress_forward: plan record \d+ is not a "
                                         r"decode record"):
        ops.compress_forward_op(state128, d128.kv_in, d128.ape, online.plan_d, None,
                                torch.empty(2, 128, device=device), 128, 128)
    # legal plans pass the debug checks
    dsv4_ops.compress_forward(d.state.clone(), d.kv_in, d.ape, dplan, head_dim=128, compress_ratio=4)
    dsv4_ops.compress_forward(w.state.clone(), w.kv_in, w.ape, pplan, head_dim=128, compress_ratio=4)
    _store_call(d, dplan)()
    _store_call(w, pplan)()


@pytest.mark.parametrize("bad", ["list", "tensor"])
def test_plan_that_is_not_a_plan_object(device, bad):
    w = decode_world(device)
    plan = _decode_plan(w)
    obj = list(plan) if bad == "list" else plan.plan_d
    raises_type("compress_forward", "plan", lambda: dsv4_ops.compress_forward(
        w.state, w.kv_in, w.ape, obj, head_dim=128, compress_ratio=4))
    raises_type("compress_norm_rope_store", "plan", _store_call(w, plan, plan=obj))


def test_plan_copy_between_batch_sizes(device):
    d = decode_world(device)
    two = _decode_plan(d)
    one = _decode_plan(d, req_pool_indices=d.rid[:1], seq_lens=d.seq_lens[:1])
    raises("CompressorDecodePlan.copy_", "other", lambda: two.copy_(one))
    raises("CompressorDecodePlan.copy_", "other", lambda: one.copy_(two))
    raises_type("CompressorDecodePlan.copy_", "other", lambda: two.copy_(_prefill_plan(make_world(device))))
    w = make_world(device)
    full = _prefill_plan(w, use_cuda_graph=True)
    small = _prefill_plan(w, num_q_tokens=w.num_q - 5, extend_lens=w.extend_lens - torch.tensor(
        [5, 0], device=device), seq_lens=w.seq_lens - torch.tensor([5, 0], device=device),
        use_cuda_graph=True)
    small.copy_(full.__class__(4, full.plan_c[:3], full.plan_w[:3], full.counts))  # fewer rows: fine
    raises("CompressorPrefillPlan.copy_", "other", lambda: small.copy_(full))
    online = dsv4_ops.CompressorPrefillPlan.generate_online(
        w.seq_lens, w.extend_lens, w.rid, w.req_to_token, w.num_q)
    raises("CompressorPrefillPlan.copy_", "other", lambda: online.copy_(
        dsv4_ops.CompressorPrefillPlan.generate(128, w.rid, w.seq_lens, w.extend_lens,
                                                w.req_to_token, w.full_to_state, 64, 128,
                                                w.num_q)))


@pytest.mark.parametrize("table", ["short_rows", "complex128", "real_wrong_width"])
def test_bad_freq_cis_is_named_freq_cis(device, table):
    d = decode_world(device)
    plan = _decode_plan(d)
    f = {"short_rows": d.freqs[:, :16], "complex128": d.freqs.to(torch.complex128),
         "real_wrong_width": d.freqs_real[:, :32]}[table]
    with pytest.raises(ValueError, match=r"dsv4\.compress_norm_rope_store: freq_cis must be "
                                         r"complex64 \[max_pos, 32\]"):
        _store_call(d, plan, freq_cis=f)()


# ---- the V4.1 ops (contract V4.1 4.4), raw and through their fakes ----------------------------

def _bf16(t):
    return t.to(torch.bfloat16)


def _narrow(cols):
    return lambda t: t[..., :cols].contiguous()


LOW_RATIO_BAD = [
    # (sample of op_samples.low_ratio_samples, argument, replacement: a value or a function of
    #  the sample's value)
    ("c1_norm_rope_store", "kv", lambda t: t.float()),
    ("c1_norm_rope_store", "kv", _narrow(256)),                       # hd != 512
    ("c1_norm_rope_store", "kv", lambda t: t.t().contiguous().t()),  # not contiguous
    ("c1_norm_rope_store", "norm_weight", lambda t: t[:128]),
    ("c1_norm_rope_store", "freqs", _narrow(32)),                     # rope != 64
    ("c1_norm_rope_store", "freqs", lambda t: t.double()),
    ("c1_norm_rope_store", "positions", lambda t: t[:3]),
    ("c1_norm_rope_store", "positions", lambda t: t.float()),
    ("c1_norm_rope_store", "out_loc", lambda t: t.to(torch.int16)),
    ("c1_norm_rope_store", "kvcache", _narrow(1000)),                 # narrower than a page
    ("c1_norm_rope_store", "kvcache", lambda t: t.to(torch.float16)),
    ("c1_norm_rope_store", "page_size", 48),                          # not a power of two
    ("c1_norm_rope_store", "kvcache", 256),                           # pages hold only 64
    ("c1_norm_rope_store", "page_size", 16),                          # pages hold 4x that
    ("c1_norm_rope_store", "layout", "v42"),
    ("c1_norm_rope_store", "latent", lambda t: t.float()),
    ("c1_norm_rope_store", "latent", lambda t: t[:5]),
    ("c1_norm_rope_store", "eps", -1.0),
    ("c1_norm_rope_store_dcp", "dcp_world_size", 0),
    ("c1_norm_rope_store_dcp", "dcp_rank", 2),                         # rank >= W
    ("c2_decode_dcp", "dcp_rank", -1),
    ("c2_verify_dcp", "dcp_interleave", 0),
    ("c2_prefill_dcp", "dcp_world_size", -2),
    ("low_ratio_index_k_store_dcp", "dcp_rank", 3),
    ("kv_store_v4_dcp", "dcp_interleave", -64),
    ("compress_norm_rope_store_dcp", "dcp_rank", 2),
    ("compress_norm_rope_store_dcp", "dcp_world_size", 0),
    ("c2_decode", "kv_score", _bf16),
    ("c2_decode", "kv_score", _narrow(512)),
    ("c2_decode", "state", _narrow(512)),
    ("c2_decode", "state", _bf16),
    ("c2_decode", "norm_weight", lambda t: t[:256]),
    ("c2_decode", "freqs", _narrow(62)),
    ("c2_decode", "req", lambda t: t.float()),
    ("c2_decode", "req", lambda t: t[:2]),
    ("c2_decode", "raw_out_loc", lambda t: t.float()),
    ("c2_decode", "positions", lambda t: t[:1]),
    ("c2_decode", "kvcache", _narrow(100)),
    ("c2_decode", "page_size", 3),
    ("c2_decode", "ring_size", 0),                                    # ring_size < 1
    ("c2_decode", "ring_size", -4),
    ("c2_decode", "layout", "fp8_ds_mla"),
    ("c2_decode", "latent", lambda t: t[:, :256].contiguous()),
    ("c2_verify", "kv_score", lambda t: t[:3]),                       # N % draft_len != 0
    ("c2_prefill", "extend_start_loc", lambda t: t.long()),
    ("c2_prefill", "extend_seq_lens", lambda t: t[:1]),
    ("c2_prefill", "extend_seq_lens", lambda t: t.float()),
    ("c2_prefill", "kv_score", lambda t: t.double()),
    ("c2_prefill", "ring_size", 0),
    ("c2_prefill", "layout", ""),
    ("low_ratio_index_k_store", "k", lambda t: t.float()),
    ("low_ratio_index_k_store", "k", lambda t: torch.zeros(t.shape[0], 512, dtype=t.dtype,
                                                           device=t.device)),
    ("low_ratio_index_k_store", "norm_weight", lambda t: torch.ones(512, dtype=t.dtype,
                                                                     device=t.device)),
    ("low_ratio_index_k_store", "freqs", _narrow(32)),
    ("low_ratio_index_k_store", "loc", lambda t: t.float()),
    ("low_ratio_index_k_store", "cache", _narrow(68 * 64 - 1)),
    ("low_ratio_index_k_store", "cache", lambda t: t.view(torch.float8_e4m3fn)),
    ("low_ratio_index_k_store", "page_size", 24),
    ("low_ratio_index_k_store", "ratio", 4),
    ("low_ratio_index_k_store", "ratio", 0),
    ("kv_store_rope", "x", lambda t: t.to(torch.float16)),
    ("kv_store_rope", "x", _narrow(448)),
    ("kv_store_rope", "loc", lambda t: t.float()),
    ("kv_store_rope", "freqs_rows", _narrow(32)),
    ("kv_store_rope", "freqs_rows", lambda t: t[:2]),
    ("kv_store_rope", "kvcache", _narrow(512)),
    ("kv_store_rope", "page_size", 12),
    ("kv_store_rope", "layout", "v4.1"),
    ("kv_store_v4", "freqs_rows", lambda _: torch.zeros(3, 64)),     # V4 has no in-kernel RoPE
]


def _sample_call(samples, device, sample, arg, change):
    """(op name, a call of sample `sample` of op_samples.<samples>(device) with argument `arg`
    changed)."""
    import op_samples
    op, args = getattr(op_samples, samples)("cpu" if device == "meta" else device)[sample]
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    names = [a.name for a in op.default._schema.arguments]
    i = names.index("page_size" if isinstance(change, int) and arg == "kvcache" else arg)
    new = change(args[i]) if callable(change) else change
    if isinstance(new, torch.Tensor):
        new = new.to(device) if new.device != torch.device(device) else new
    args[i] = new
    return op.default._schema.name.split("::")[1], lambda: op(*args)




def test_low_ratio_verify_ring_not_wider_than_draft(device):
    """Verify with ring_size <= draft_len: the message says the ring must be wider."""
    from op_samples import low_ratio_samples
    op, args = low_ratio_samples(device)["c2_verify"]
    names = [a.name for a in op.default._schema.arguments]
    for ring, draft in ((2, 2), (4, 4), (2, 4)):
        args = list(args)
        args[names.index("ring_size")], args[names.index("draft_len")] = ring, draft
        with pytest.raises((RuntimeError, ValueError),
                           match=r"dsv4\.c2_norm_rope_store: .*ring.*must be wider than the "
                                 r"draft length"):
            op(*args)


@pytest.mark.parametrize("fmt", ["fp8_indexer", "fp4_indexer", "bf16"])
def test_compress_norm_rope_store_v41_layout_needs_fp8_ds_mla(device, fmt):
    """A non-v4 layout is for the 512-dim fp8_ds_mla store only: other formats name layout."""
    from dsv4_ops import KVLayout
    d = decode_world(device, compress_ratio=4, head_dim=128 if fmt != "bf16" else 512)
    plan = _decode_plan(d)
    hd = 512 if fmt == "bf16" else 128
    a = _raw_store_args(d, plan.plan_d, True, store_format=fmt,
                        kv=torch.randn(2, hd, device=device),
                        norm_weight=torch.ones(hd, device=device), kvcache=d.kvcache(fmt))
    OPS.compress_norm_rope_store(*a.values(), "v4")         # the v4 layout: today's store
    for layout in (KVLayout.V41, KVLayout.V41_FP4):
        raises("compress_norm_rope_store", "layout",
               lambda: OPS.compress_norm_rope_store(*a.values(), layout.value))
    raises("compress_norm_rope_store", "layout",
           lambda: OPS.compress_norm_rope_store(*a.values(), "v5"))


LOW_RATIO_DEBUG = [
    # (sample, wrapper in dsv4_ops.ops, argument, row, value, message)
    ("c1_norm_rope_store", "c1_norm_rope_store_op", "out_loc", 1, 10 ** 6, "kvcache page outside"),
    ("c1_norm_rope_store", "c1_norm_rope_store_op", "positions", 0, 64, "RoPE position outside"),
    ("c2_decode", "c2_norm_rope_store_op", "req", 0, 100, "pair-state ring outside state"),
    ("c2_decode", "c2_norm_rope_store_op", "req", 1, -1, "pair-state ring outside state"),
    ("c2_decode", "c2_norm_rope_store_op", "positions", 1, -2, "negative position"),
    ("c2_decode", "c2_norm_rope_store_op", "raw_out_loc", 2, 10 ** 6 + 1, "kvcache page outside"),
    ("c2_verify", "c2_norm_rope_store_op", "positions", 1, 99, "RoPE position outside"),
    ("c2_prefill", "c2_prefill_norm_rope_store_op", "extend_seq_lens", 1, 5, "row range outside"),
    ("c2_prefill", "c2_prefill_norm_rope_store_op", "req", 3, 50, "pair-state ring outside"),
    ("low_ratio_index_k_store", "low_ratio_index_k_store_op", "loc", 0, 10 ** 5,
     "cache page outside"),
    ("low_ratio_index_k_store", "low_ratio_index_k_store_op", "positions", 3, 64, "RoPE position"),
    ("kv_store_rope", "kv_store_op", "loc", 0, 10 ** 5, "kvcache page outside"),
]


@pytest.mark.parametrize("sample,wrapper,arg,row,value,message", LOW_RATIO_DEBUG,
                         ids=[f"{c[0]}-{c[2]}" for c in LOW_RATIO_DEBUG])
def test_low_ratio_debug_mode_names_the_row(device, debug_mode, sample, wrapper, arg, row,
                                            value, message):
    """Debug mode (contract V4.1 4.4): a row outside state / the cache / freqs is an error
    naming the op and the row; normal mode skips it (the call succeeds)."""
    from op_samples import low_ratio_samples
    op, args = low_ratio_samples(device)[sample]
    names = [a.name for a in op.default._schema.arguments]
    args = list(args)
    i = names.index(arg)
    args[i] = args[i].clone()
    args[i][row] = value
    call = getattr(ops, wrapper)
    name = op.default._schema.name.split("::")[1]
    with pytest.raises(ValueError, match=rf"dsv4\.{name}: row {row} .*{message}"):
        call(*args)
    dsv4_ops.set_debug(False)
    if arg != "extend_seq_lens":
        call(*args)


def test_low_ratio_python_layer_bad_input(device):
    """The drop-in layer (contract V4.1 4.3) names its function and the argument."""
    from op_samples import low_ratio_samples
    s = low_ratio_samples(device)
    kv, w, eps, freqs, pos, loc, cache, ps, _, _ = s["c1_norm_rope_store"][1]
    raises("c1_decode_norm_rope_store", "layout", lambda: dsv4_ops.c1_decode_norm_rope_store(
        kv, w, pos, loc, eps, freqs, cache, page_size=ps, layout="v5"))
    x, loc_s, freqs_rows, kvcache, ps_s, layout = s["kv_store_rope"][1]
    raises("fused_store_cache", "type", lambda: dsv4_ops.fused_store_cache(
        x, kvcache, loc_s, page_size=ps_s, type="paged", layout=layout, freqs_cis=freqs_rows))
    raises("fused_store_cache", "layout", lambda: dsv4_ops.fused_store_cache(
        x, kvcache, loc_s, page_size=ps_s, layout="fp8_ds_mla"))
    k, w128, eps, freqs, pos_k, loc_k, icache, _, ratio = s["low_ratio_index_k_store"][1]
    raises("index_k_norm_rope_pack_store", "cache", lambda: dsv4_ops.index_k_norm_rope_pack_store(
        k, w128, eps, freqs, pos_k, loc_k, icache.view(-1), ratio=ratio))
    raises("low_ratio_index_k_store", "ratio", lambda: dsv4_ops.index_k_norm_rope_pack_store(
        k, w128, eps, freqs, pos_k, loc_k, icache, ratio=4))
    raises("low_ratio_out_loc", "ratio", lambda: dsv4_ops.low_ratio_out_loc(0, pos_k, loc_k))
    state = s["c2_verify"][1]
    raises("c2_norm_rope_store", "ring_size", lambda: dsv4_ops.c2_decode_norm_rope_store(
        state[0], state[1], state[2], state[5], state[6], state[7], state[3], state[4], state[8],
        page_size=state[9], ring_size=2, draft_len=2, layout=state[12]))


# ---- context-parallel prefill (contract 8), raw and through their fakes -----------------------

CP_BAD = [
    # (sample of op_samples.cp_samples, argument, replacement: a value or a function of it)
    ("compress_partials_c4", "kv_score_buffer", _narrow(100)),
    ("compress_partials_c4", "kv_score_input", lambda t: t.double()),
    ("compress_partials_c4", "kv_score_input", _narrow(256)),          # 2*hd: a cr 128 row
    ("compress_partials_c4", "input_rows", lambda t: t.long()),
    ("compress_partials_c4", "input_rows", lambda t: t.view(1, -1)),
    ("compress_partials_c4", "ape", lambda t: t[:4].contiguous()),
    ("compress_partials_c4", "plan_c", _narrow(8)),
    ("compress_partials_c4", "plan_w", _narrow(4)),
    ("compress_partials_c4", "partials", lambda t: t[:, 1:].contiguous()),  # a window short
    ("compress_partials_c4", "partials", lambda t: t.double()),
    ("compress_partials_c4", "persist_rows", _bf16),
    ("compress_partials_c4", "persist_rows", lambda t: t[1:]),
    ("compress_partials_c4", "head_dim", 256),
    ("compress_partials_c4", "compress_ratio", 8),
    ("compress_partials_c128", "kv_score_buffer", lambda t: t.to(torch.float16)),
    ("compress_partials_c128", "partials", lambda t: t[:, :, :128].contiguous()),
    ("merge_partials_rows", "partials", lambda t: t[:, :2].contiguous()),
    ("merge_partials_rows", "partials", _bf16),
    ("merge_partials_rows", "partials", lambda t: t.transpose(2, 3)),  # not contiguous
    ("merge_partials_rows", "out", lambda t: t[:, :64].contiguous()),
    ("merge_partials_rows", "out", lambda t: t.half()),
    ("merge_partials_rebase", "max_m", lambda t: t[:, :10].contiguous()),
    ("merge_partials_rebase", "max_m", _bf16),
    ("merge_partials_rebase", "out", _bf16),                         # a partial is fp32
]


# (op_samples function, sample, argument, replacement) of every bad-input case of the samples
SAMPLE_BAD = ([("low_ratio_samples", *c) for c in LOW_RATIO_BAD]
              + [("cp_samples", *c) for c in CP_BAD])
SAMPLE_BAD_IDS = [f"{s}-{a}-{k}" for k, (_, s, a, _) in enumerate(SAMPLE_BAD)]


@pytest.mark.parametrize("samples,sample,arg,change", SAMPLE_BAD, ids=SAMPLE_BAD_IDS)
def test_sample_bad_input(device, samples, sample, arg, change):
    op, call = _sample_call(samples, device, sample, arg, change)
    raises(op, arg, call)


@pytest.mark.parametrize("samples,sample,arg,change", SAMPLE_BAD, ids=SAMPLE_BAD_IDS)
def test_fakes_refuse_bad_sample_input(samples, sample, arg, change):
    """The same checks on meta tensors (the fakes that torch.compile and export run)."""
    op, call = _sample_call(samples, "meta", sample, arg, change)
    raises(op, arg, call)


def test_cp_outputs_sharing_memory(device):
    """The outputs of compress_partials and merge_partials must not alias their inputs."""
    from op_samples import cp_samples
    s = cp_samples(device)
    op, args = s["compress_partials_c4"]
    a = list(args)
    a[6] = a[0].view(-1)[: a[6].numel()].view(a[6].shape)   # partials inside the state
    raises("compress_partials", "partials", lambda: op(*a))
    op, args = s["merge_partials_rebase"]
    raises("merge_partials", "out", lambda: op(args[0], args[1], args[0][0]))


def test_cp_debug_mode_names_a_bad_input_row(device, debug_mode):
    """Debug mode: an input_rows entry that is neither -1 nor a local row is an error naming
    compress_partials and the entry; normal mode treats it as a row another rank holds."""
    from op_samples import cp_samples
    _, args = cp_samples(device)["compress_partials_c4"]
    args = list(args)
    args[2] = args[2].clone()
    args[2][3] = args[1].shape[0]
    with pytest.raises(ValueError, match=r"dsv4\.compress_partials: input_rows\[3\]"):
        ops.compress_partials_op(*args)
    dsv4_ops.set_debug(False)
    ops.compress_partials_op(*args)
