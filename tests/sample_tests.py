"""The checks every op family runs on its samples (op_samples.py) through PyTorch's machinery:
torch.library.opcheck (schema, mutation annotations, fakes, AOT dispatch), one launch writing
every (a!) argument and nothing else, the fakes on meta tensors, torch.compile(fullgraph=True)
giving eager's bytes. A family's test module binds them to its samples:

    test_opcheck, test_samples_write_only_their_outputs, test_meta_tensors, \\
        test_compiled_equals_eager = sample_tests(cp_samples)
"""
import pytest
import torch

import low_ratio_cases as lr


def mutated(op, args):
    """Indices of the arguments the schema says the op writes."""
    return [i for i, a in enumerate(op.default._schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write]


def clone(args):
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def assert_same_writes(op, args_a, args_b, what):
    for i in mutated(op, args_a):
        if args_a[i] is None:  # an optional output left out
            assert args_b[i] is None, f"{what}: argument {i}"
            continue
        lr.assert_same_bits(args_a[i], args_b[i], f"{what}: argument {i}")


def assert_writes_only_outputs(op, args, what):
    """One launch of op on args changes every (a!) argument (there is one) and no other."""
    before = clone(args)
    op(*args)
    written = mutated(op, args)
    assert written, what
    for i, (a, b) in enumerate(zip(args, before)):
        if not isinstance(a, torch.Tensor):
            continue
        if i in written:
            assert not torch.equal(lr.as_bytes(a), lr.as_bytes(b)), f"{what}: {i} unwritten"
        else:
            lr.assert_same_bits(a, b, f"{what}: input argument {i}")


def assert_compiled_equals_eager(op, args, what, dynamic=False):
    eager, compiled = clone(args), clone(args)
    op(*eager)
    torch._dynamo.reset()
    torch.compile(lambda *a: op(*a), fullgraph=True, dynamic=dynamic)(*compiled)
    assert_same_writes(op, eager, compiled, f"{what} compiled")


def sample_tests(samples):
    """The four tests over every sample of `samples` (device -> {name: (op, args)})."""
    names = sorted(samples("cpu"))

    @pytest.mark.parametrize("name", names)
    def test_opcheck(device, name):
        torch.library.opcheck(*samples(device)[name])

    @pytest.mark.parametrize("name", names)
    def test_samples_write_only_their_outputs(device, name):
        assert_writes_only_outputs(*samples(device)[name], name)

    @pytest.mark.parametrize("name", names)
    def test_meta_tensors(name):
        """The fakes accept the sample on the meta device and write nothing observable."""
        op, args = samples("cpu")[name]
        op(*[a.to("meta") if isinstance(a, torch.Tensor) else a for a in args])

    @pytest.mark.parametrize("name", names)
    def test_compiled_equals_eager(device, name):
        assert_compiled_equals_eager(*samples(device)[name], name)

    return (test_opcheck, test_samples_write_only_their_outputs, test_meta_tensors,
            test_compiled_equals_eager)
