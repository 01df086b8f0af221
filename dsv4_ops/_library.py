"""Loads the compiled operator library (dsv4_ops/_C.so) into torch.ops.dsv4."""
import glob
import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))


def _find_library() -> str:
    for pattern in ("_C.so", "_C.*.so", "_C*.pyd", "_C*.dylib"):
        hits = sorted(glob.glob(os.path.join(_HERE, pattern)))
        if hits:
            return hits[0]
    raise ImportError(
        "dsv4_ops: the compiled library dsv4_ops/_C.so is missing; build it with "
        "`pip install --no-build-isolation -e .` (see README.md)")


LIBRARY_PATH = _find_library()
torch.ops.load_library(LIBRARY_PATH)


def has_kernel(op_name: str, dispatch_key: str) -> bool:
    """Whether torch.ops.dsv4.<op_name> has a kernel registered for `dispatch_key`."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"dsv4::{op_name}", dispatch_key)


OP_NAMES = (
    "plan_decode", "plan_decode_legacy", "plan_online_decode",
    "plan_prefill", "plan_prefill_legacy", "plan_online_prefill",
    "compress_forward", "compress_norm_rope_store",
)
