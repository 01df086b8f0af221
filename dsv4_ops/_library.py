"""Loads the compiled operator library (dsv4_ops/_C.so) into torch.ops.dsv4, after checking
its build record (_build_info.json, written by setup.py) against the imported torch."""
import glob
import json
import os

import torch

_HERE = os.path.dirname(os.path.abspath(__file__))
REBUILD_COMMAND = ("`pip install --no-build-isolation -e .` in the source tree "
                   "(`pip install --no-build-isolation .` to install a copy)")


def _find_library() -> str:
    for pattern in ("_C.so", "_C.*.so", "_C*.pyd", "_C*.dylib"):
        hits = sorted(glob.glob(os.path.join(_HERE, pattern)))
        if hits:
            return hits[0]
    raise ImportError(
        f"dsv4_ops: the compiled library dsv4_ops/_C.so is missing; build it with "
        f"{REBUILD_COMMAND}, see README.md")


def read_build_record(library_path: str) -> dict:
    """The build record setup.py writes next to the library: version, torch, gpu, cuda, hip,
    archs."""
    path = os.path.join(os.path.dirname(library_path), "_build_info.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ImportError(
            f"dsv4_ops: the build record {path} is missing or unreadable ({e}); rebuild the "
            f"library with {REBUILD_COMMAND}") from None


def check_build_record(record: dict, library_path: str, torch_version: str) -> None:
    """Raise ImportError unless the library was built against `torch_version`.

    The whole version string must match: libtorch keeps no C++ ABI across releases (a
    different major.minor.patch, or a dev/pre-release tag, can change the symbols and layouts
    the library links against), and the local tag (+cpu, +cu130, +rocm6.4) names the GPU
    runtime that libtorch, and so the library, is linked with."""
    built = record.get("torch")
    if built != torch_version:
        raise ImportError(
            f"dsv4_ops: {library_path} was built against torch {built}, but torch "
            f"{torch_version} is imported; rebuild it against this torch with "
            f"{REBUILD_COMMAND}")


LIBRARY_PATH = _find_library()
BUILD_RECORD = read_build_record(LIBRARY_PATH)
check_build_record(BUILD_RECORD, LIBRARY_PATH, str(torch.__version__))
VERSION = BUILD_RECORD["version"]
torch.ops.load_library(LIBRARY_PATH)


def has_kernel(op_name: str, dispatch_key: str) -> bool:
    """Whether torch.ops.dsv4.<op_name> has a kernel registered for `dispatch_key`."""
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"dsv4::{op_name}", dispatch_key)


# Every operator of the registration block (csrc/registration.cpp), as registered.
OP_NAMES = tuple(sorted(name.split("::", 1)[1] for name in torch._C._dispatch_get_all_op_names()
                        if name.startswith("dsv4::")))
