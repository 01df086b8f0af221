"""Packaging: every op is registered with a kernel for each built backend, importing the
package is fast and compiles nothing, and the CMake build makes a loadable library."""
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from dsv4_ops import _library

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_op_has_kernels():
    keys = ["CPU"] + (["CUDA"] if torch.cuda.is_available() else [])
    for op in _library.OP_NAMES:
        for key in keys:
            assert _library.has_kernel(op, key), f"dsv4::{op} has no {key} kernel"


def test_import_is_fast_and_compiles_nothing():
    code = textwrap.dedent("""
        import sys, time
        import torch
        t = time.perf_counter()
        import dsv4_ops
        dt = time.perf_counter() - t
        assert "torch.utils.cpp_extension" not in sys.modules, "import pulled in the JIT compiler"
        print(dt)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True)
    assert float(out.stdout.strip().splitlines()[-1]) < 0.5


@pytest.fixture(scope="module")
def cmake_library(tmp_path_factory):
    if shutil.which("cmake") is None:
        pytest.fail("cmake is required for the libtorch build test")
    build = tmp_path_factory.mktemp("cmake-build")
    prefix = torch.utils.cmake_prefix_path
    subprocess.run(["cmake", "-S", ROOT, "-B", str(build), f"-DCMAKE_PREFIX_PATH={prefix}",
                    "-DDSV4_WITH_CUDA=OFF", "-DCMAKE_BUILD_TYPE=Release", "-G", "Ninja"],
                   check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2)], check=True,
                   capture_output=True)
    return build / "libdsv4_ops.so"


def test_cmake_library_loads_and_runs(cmake_library):
    # A fresh process: the Python extension registers the same namespace and must not be loaded.
    code = textwrap.dedent(f"""
        import torch
        torch.ops.load_library({str(cmake_library)!r})
        rid = torch.tensor([3, 0, 5])
        seq = torch.tensor([9, 4, 130])
        plan = torch.ops.dsv4.plan_decode_legacy(rid, seq, 4).view(torch.int32)
        # legacy cr=4 slots: rid * 8 + pos % 8 (SPEC 2.1)
        p1 = seq - 1
        p0 = (p1 - 4).clamp(min=0)
        wl = rid * 8 + p1 % 8
        expected = torch.stack([seq, wl, (rid * 8 + p0 % 8) // 4, wl // 4], 1).to(torch.int32)
        assert torch.equal(plan, expected), (plan, expected)
        for op in {list(_library.OP_NAMES)!r}:
            assert torch._C._dispatch_has_kernel_for_dispatch_key("dsv4::" + op, "CPU"), op
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
