"""torch.export of a whole compressor step (plan, compress_forward, compress_norm_rope_store):
the exported program, run, gives the same outputs, state and cache bytes as eager; with a
dynamic decode batch too. AOTInductor compiles the exported step ahead of time into a package
whose loaded module gives the same bytes, on every device (its C++ compile takes 30-80 s per
device)."""
import pytest
import torch

import dsv4_ops

from op_samples import decode_world, make_world
from test_compile import assert_same_run, decode_step, padded_prefill_args, prefill_step


class _Step(torch.nn.Module):
    def __init__(self, step, **static):
        super().__init__()
        self.step, self.static = step, static

    def forward(self, *args):
        return self.step(*args, **self.static)


def _decode_case(device, cr, hd):
    w = decode_world(device, compress_ratio=cr, head_dim=hd)
    cache = w.kvcache(dsv4_ops.store_format_of(hd))
    args = [w.state, w.kv_in, w.ape, w.rid, w.req_to_token, w.full_to_state, w.seq_lens,
            w.norm_weight, w.freqs, w.out_loc, cache]
    module = _Step(decode_step, cr=cr, hd=hd, ring=w.ring, page_size=w.cache_page_size,
                   fmt_fp4=False)
    return module, args


@pytest.mark.parametrize("cr,hd", [(4, 128), (128, 512)])
def test_exported_decode_step_equals_eager(device, cr, hd):
    module, args = _decode_case(device, cr, hd)
    ep = torch.export.export(module, tuple(a.clone() for a in args))
    names = {n.target.name() for n in ep.graph.nodes if n.op == "call_function"
             and isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == "dsv4"}
    assert names == {"dsv4::plan_decode", "dsv4::compress_forward",
                     "dsv4::compress_norm_rope_store"}, names
    assert_same_run(module, ep.module(), args, state_i=0, cache_i=10)


def test_exported_decode_step_dynamic_batch(device):
    module, args = _decode_case(device, 4, 128)
    batch = torch.export.Dim("batch", min=2, max=1024)
    # Batch-sized inputs: kv_in (1), req_pool_indices (3), seq_lens (6), out_loc (9).
    shapes = [None] * len(args)
    for i in (1, 3, 6, 9):
        shapes[i] = {0: batch}
    # forward(*args): the spec of the one varargs entry.
    ep = torch.export.export(module, tuple(a.clone() for a in args),
                             dynamic_shapes=(tuple(shapes),))
    assert_same_run(module, ep.module(), args, state_i=0, cache_i=10)
    # The same program on a smaller batch (the first two requests).
    small = list(args)
    for i in (1, 3, 6, 9):
        small[i] = args[i][:2].clone()
    assert_same_run(module, ep.module(), small, state_i=0, cache_i=10)


def test_exported_prefill_step_equals_eager(device):
    w = make_world(device, compress_ratio=4, head_dim=512)
    args, num_q = padded_prefill_args(w)
    module = _Step(prefill_step, cr=4, hd=512, ring=w.ring, page_size=w.cache_page_size,
                   num_q=num_q)
    ep = torch.export.export(module, tuple(a.clone() for a in args))
    assert_same_run(module, ep.module(), args, state_i=0, cache_i=11)


def test_aot_inductor_decode_step_equals_eager(device, tmp_path):
    module, args = _decode_case(device, 4, 128)
    ep = torch.export.export(module, tuple(a.clone() for a in args))
    path = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "step.pt2"))
    assert_same_run(module, torch._inductor.aoti_load_package(path), args, state_i=0, cache_i=10)
