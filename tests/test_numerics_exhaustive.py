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
patterns (a few minutes on two cores)."""
import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SOURCE = os.path.join(HERE, "native", "numerics_exhaustive.cpp")
CXX = os.environ.get("CXX", "g++")

pytestmark = pytest.mark.skipif(shutil.which(CXX) is None, reason=f"needs a C++ compiler ({CXX})")


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    exe = str(tmp_path_factory.mktemp("numerics") / "numerics_exhaustive")
    include = os.path.join(ROOT, "csrc", "include")
    subprocess.run([CXX, "-std=c++17", "-O2", "-fopenmp", "-I", include, "-o", exe, SOURCE],
                   check=True, capture_output=True, text=True)
    return exe


def run_checker(exe, *args):
    r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    # Every function reported, none with a mismatch.
    assert sum(line.endswith(": 0 mismatches") for line in lines) == 5, r.stdout
    return lines


def test_conversions_match_on_sample(checker):
    lines = run_checker(checker)
    assert int(lines[0].split()[1]) > 1_000_000


@pytest.mark.slow
def test_conversions_match_on_every_fp32(checker):
    lines = run_checker(checker, "all")
    assert int(lines[0].split()[1]) == 1 << 32
