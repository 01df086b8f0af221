"""Packaging: every op is registered with a kernel for each built backend, importing the
package is fast and compiles nothing, the build record names this torch and the project's
version and a record of another torch stops the import with one clear error, and the CMake
build makes a loadable library."""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from dsv4_ops import _library

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_op_names_are_the_registration_block():
    with open(os.path.join(ROOT, "csrc", "registration.cpp")) as f:
        defined = re.findall(r'm\.def\(\s*"(\w+)\(', f.read())
    assert defined and sorted(defined) == list(_library.OP_NAMES)


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


def test_build_record_names_this_torch_and_the_project_version():
    import dsv4_ops

    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        version = re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)
    record = _library.BUILD_RECORD
    assert record["torch"] == str(torch.__version__)
    assert record["version"] == version == dsv4_ops.__version__
    assert record["gpu"] in (None, "cuda", "hip")
    if record["gpu"] == "cuda":
        assert record["cuda"] == torch.version.cuda and record["archs"]


def _import_copy(tmp_path, record):
    """Import a copy of the package whose library is this build's and whose build record is
    `record` (None: no record), in a fresh process; returns what the import printed."""
    pkg = tmp_path / "dsv4_ops"
    shutil.copytree(os.path.dirname(_library.__file__), pkg,
                    ignore=shutil.ignore_patterns("*.so", "__pycache__", "_build_info.json"))
    os.symlink(_library.LIBRARY_PATH, pkg / os.path.basename(_library.LIBRARY_PATH))
    if record is not None:
        (pkg / "_build_info.json").write_text(json.dumps(record))
    code = textwrap.dedent("""
        import torch
        try:
            import dsv4_ops
        except ImportError as e:
            print("ImportError:", e)
        print("loaded:", hasattr(torch.ops.dsv4, "plan_decode"))
    """)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                         text=True, check=True)
    return out.stdout


def test_build_for_another_torch_raises_one_clear_import_error(tmp_path):
    record = dict(_library.BUILD_RECORD, torch="2.5.1+cu118")
    out = _import_copy(tmp_path, record)
    assert out.count("ImportError:") == 1, out
    assert str(tmp_path) in out, out  # the copy was imported, not the installed package
    assert "built against torch 2.5.1+cu118" in out and f"torch {torch.__version__} is imported" in out
    assert "pip install --no-build-isolation" in out
    assert "loaded: False" in out  # stopped before torch.ops.load_library


def test_build_without_record_raises_import_error(tmp_path):
    out = _import_copy(tmp_path, None)
    assert "ImportError:" in out and "_build_info.json" in out and "pip install" in out, out
    assert "loaded: False" in out


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


@pytest.mark.slow
def test_cmake_library_loads_and_runs(cmake_library):
    # A fresh process: the Python extension registers the same namespace and must not be loaded.
    code = textwrap.dedent(f"""
        import torch
        torch.ops.load_library({str(cmake_library)!r})
        rid = torch.tensor([3, 0, 5])
        seq = torch.tensor([9, 4, 130])
        plan = torch.ops.dsv4.plan_decode_legacy(rid, seq, 4).view(torch.int32)
        # legacy cr=4 slots: rid * 8 + pos % 8 (docs/contract.md 2.1)
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
