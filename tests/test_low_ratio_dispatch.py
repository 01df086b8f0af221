"""The V4.1 ops (and compress_norm_rope_store with a V41 layout) through PyTorch's machinery,
on the samples of op_samples.low_ratio_samples: torch.library.opcheck (schema, mutation
annotations, fakes, AOT dispatch), meta tensors, torch.compile(fullgraph=True) and torch.export
giving eager's bytes, CUDA-graph replay after in-place input changes giving eager's bytes."""
import pytest
import torch

from op_samples import low_ratio_samples

import low_ratio_cases as lr
from sample_tests import (assert_compiled_equals_eager, assert_same_writes, clone, mutated,
                          sample_tests)

NAMES = sorted(low_ratio_samples("cpu"))


def _sample(device, name):
    return low_ratio_samples(device)[name]


test_opcheck, test_samples_write_only_their_outputs, test_meta_tensors, \
    test_compiled_equals_eager = sample_tests(low_ratio_samples)


def test_compiled_dynamic_verify_equals_eager(device):
    assert_compiled_equals_eager(*_sample(device, "c2_verify"), "c2_verify (dynamic)",
                                 dynamic=True)


class _Step(torch.nn.Module):
    """c2 verify then index-K then c1, one exported program."""

    def __init__(self, c2, ik, c1):
        super().__init__()
        self.c2, self.ik, self.c1 = c2, ik, c1

    def forward(self, c2_args, ik_args, c1_args):
        self.c2(*c2_args)
        self.ik(*ik_args)
        self.c1(*c1_args)
        return c2_args[-1].clone(), c1_args[-1].clone()


def test_exported_step_equals_eager(device):
    samples = low_ratio_samples(device)
    (c2, c2_args), (ik, ik_args), (c1, c1_args) = (
        samples[k] for k in ("c2_verify", "low_ratio_index_k_store", "c1_norm_rope_store"))

    def split(args):
        tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
        return tensors

    def bind(op, args):
        tensor_at = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
        consts = list(args)

        def call(*tensors):
            full = list(consts)
            for i, t in zip(tensor_at, tensors):
                full[i] = t
            op(*full)
        return call

    module = _Step(bind(c2, c2_args), bind(ik, ik_args), bind(c1, c1_args))
    inputs = tuple(split(a) for a in (c2_args, ik_args, c1_args))
    ep = torch.export.export(module, tuple(tuple(t.clone() for t in grp) for grp in inputs))
    names = {n.target.name() for n in ep.graph.nodes if n.op == "call_function"
             and isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == "dsv4"}
    assert names == {"dsv4::c2_norm_rope_store", "dsv4::low_ratio_index_k_store",
                     "dsv4::c1_norm_rope_store"}, names
    eager = tuple(tuple(t.clone() for t in grp) for grp in inputs)
    exported = tuple(tuple(t.clone() for t in grp) for grp in inputs)
    module(*eager)
    ep.module()(*exported)
    for ge, gx in zip(eager, exported):
        for k, (a, b) in enumerate(zip(ge, gx)):
            lr.assert_same_bits(b, a, f"exported step tensor {k}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", NAMES)
def test_cuda_graph_replay_equals_eager(name):
    """Capture the launch, refill its float inputs in place, replay: eager's bytes."""
    dev = torch.device("cuda", 0)
    op, args = _sample(dev, name)
    written = mutated(op, args)
    static = clone(args)
    saved = [static[i].clone() for i in written]
    from test_cuda_graph import _capture
    graph, _ = _capture(lambda: op(*static))     # runs the op once, then captures it
    gen = torch.Generator(device=dev).manual_seed(5)
    for _ in range(2):
        for i, a in enumerate(static):
            if isinstance(a, torch.Tensor) and i not in written and a.dtype in (
                    torch.float32, torch.bfloat16) and a.dim() == 2 and a.shape[1] in (128, 512,
                                                                                       1024):
                a.normal_(generator=gen)
        for i, v in zip(written, saved):
            static[i].copy_(v)
        eager = clone(static)
        graph.replay()
        op(*eager)
        torch.cuda.synchronize()
        assert_same_writes(op, static, eager, f"{name} graph replay")
