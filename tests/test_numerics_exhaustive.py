"""The bit-level conversions of the torch-free headers against independent formulas.

tests/native/numerics_exhaustive.cpp includes csrc/include/dsv4/low_ratio_math.h (with
numerics.h) and compares, for fp32 inputs given as bit patterns: e2m1_rne_index and
e2m1_rne_value (the nearest-even e2m1 rounding, computed from the bits) with the contract's
threshold count; f32_to_e2m1 (ties to the smaller magnitude) with its threshold count;
v41_fp4_scale_byte (the clamp moved before a reciprocal-and-correction quotient) with the IEEE
division rule; e4m3_value with the e4m3fn definition for all 256 bytes. The CPU and the GPU
kernels compile the same functions from the same header (IEEE fp32 operations, no contraction
left to the compiler), so the CPU's verdict holds for both. The default run checks a spread
sample and every pattern within 4096 ulps of a boundary; the slow run every one of the 2^32
patterns (a few minutes on two cores). On a machine with a CUDA device and nvcc,
tests/native/numerics_exhaustive_gpu.cu checks the device build of the same functions (on
sm_89+ the hardware e4m3 conversions) against the same formulas and the software e4m3 rule,
every fp32 pattern."""
import os
import shutil
import subprocess

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOURCE = os.path.join(HERE, "native", "numerics_exhaustive.cpp")
CXX = os.environ.get("CXX", "g++")

needs_cxx = pytest.mark.skipif(shutil.which(CXX) is None, reason=f"needs a C++ compiler ({CXX})")


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    exe = str(tmp_path_factory.mktemp("numerics") / "numerics_exhaustive")
    include = os.path.join(ROOT, "csrc", "include")
    subprocess.run([CXX, "-std=c++17", "-O2", "-fopenmp", "-I", include, "-o", exe, SOURCE],
                   check=True, capture_output=True, text=True)
    return exe


def run_checker(exe, *args, functions=5):
    r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    # Every function reported, none with a mismatch.
    assert sum(line.endswith(": 0 mismatches") for line in lines) == functions, r.stdout
    return lines


@needs_cxx
def test_conversions_match_on_sample(checker):
    lines = run_checker(checker)
    assert int(lines[0].split()[1]) > 1_000_000


@pytest.mark.slow
@needs_cxx
def test_conversions_match_on_every_fp32(checker):
    lines = run_checker(checker, "all")
    assert int(lines[0].split()[1]) == 1 << 32


def _nvcc():
    from torch.utils import cpp_extension
    home = cpp_extension.CUDA_HOME
    path = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
    return path if path and os.path.exists(path) else None


@pytest.mark.skipif(not torch.cuda.is_available() or _nvcc() is None,
                    reason="needs a CUDA device and nvcc")
def test_device_conversions_match_on_every_fp32(tmp_path):
    major, minor = torch.cuda.get_device_capability()
    exe = str(tmp_path / "numerics_exhaustive_gpu")
    subprocess.run([_nvcc(), "-std=c++17", "-O3", f"-arch=sm_{major}{minor}",
                    "--expt-relaxed-constexpr", "-I", os.path.join(ROOT, "csrc", "include"),
                    "-o", exe, os.path.join(HERE, "native", "numerics_exhaustive_gpu.cu")],
                   check=True, capture_output=True, text=True)
    lines = run_checker(exe, functions=7)
    assert int(lines[0].split()[1]) == 1 << 32
