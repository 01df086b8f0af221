"""Build dsv4_ops: one torch extension with the CPU kernels, plus the CUDA kernels when the
installed torch has CUDA (or, through torch's hipify, ROCm).

    pip install --no-build-isolation .      # build isolation would pull another torch

Environment:
    DSV4_OPS_CPU_ONLY=1        build the CPU kernels only, even with a CUDA/ROCm torch
    DSV4_OPS_FORCE_GPU=1       build the GPU kernels even where no GPU toolkit is detected
    DSV4_OPS_TEST_HOOKS=1      a test build: the GPU kernels' test hooks (see below)
    DSV4_OPS_GPU_DEFINES       space-separated NAME=VALUE macros for the GPU compiler: the
                               kernels' tuning knobs, for A/B builds (e.g.
                               "DSV4_LR_WIDE_ROWS_MIN=0", docs/design/low_ratio.md)
    TORCH_CUDA_ARCH_LIST       CUDA targets (default "8.0;9.0;10.0")
    PYTORCH_ROCM_ARCH          ROCm targets (default "gfx90a;gfx942")
    MAX_JOBS                   parallel compile jobs
    DSV4_OPS_BUILD_TEMP        keep the compiled objects in this folder, so that the next build
                               (pip's editable ones included, which otherwise use a fresh
                               temporary folder) recompiles only what changed (ninja)
"""
import glob
import json
import os

from setuptools import setup
import torch
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))
BUILD_RECORD = "_build_info.json"  # read by dsv4_ops/_library.py


def _flag(name):
    return os.environ.get(name, "0") == "1"


def _gpu_build():
    if _flag("DSV4_OPS_CPU_ONLY"):
        return None
    if torch.version.hip is not None:
        return "hip"
    if torch.version.cuda is not None and (cpp_extension.CUDA_HOME or _flag("DSV4_OPS_FORCE_GPU")):
        return "cuda"
    return None


def extensions():
    gpu = _gpu_build()
    sources = ["csrc/registration.cpp"] + sorted(glob.glob("csrc/*/*_cpu.cpp"))
    cxx = ["-O3", "-fopenmp", "-Wall", "-Wno-unknown-pragmas"]
    include_dirs = [os.path.join(ROOT, "csrc")]
    if gpu is None:
        return [cpp_extension.CppExtension("dsv4_ops._C", sources, include_dirs=include_dirs,
                                           extra_compile_args={"cxx": cxx},
                                           extra_link_args=["-fopenmp"])]
    sources += sorted(glob.glob("csrc/*/*_cuda.cu") + glob.glob("csrc/*/instantiations/*.cu"))
    if gpu == "cuda":
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "8.0;9.0;10.0")
        gpu_flags = ["-O3", "-lineinfo", "--expt-relaxed-constexpr"]
    else:
        os.environ.setdefault("PYTORCH_ROCM_ARCH", "gfx90a;gfx942")
        gpu_flags = ["-O3"]
    # DSV4_OPS_TEST_HOOKS=1: a test build. Defines DSV4_TEST_HOOKS, which compiles the store
    # kernel's stale-plan hook (DSV4_OPS_TEST_STALE_PLAN=1 at run time: every plan guess wrong;
    # tests/test_plan_guess.py, scripts/sanitize.sh) into its launch arguments. A production
    # build's kernels do not have it, and its glue refuses DSV4_OPS_TEST_STALE_PLAN=1.
    if _flag("DSV4_OPS_TEST_HOOKS"):
        gpu_flags.append("-DDSV4_TEST_HOOKS")
    gpu_flags += ["-D" + d for d in os.environ.get("DSV4_OPS_GPU_DEFINES", "").split()]
    return [cpp_extension.CUDAExtension(
        "dsv4_ops._C", sources, include_dirs=include_dirs,
        extra_compile_args={"cxx": cxx, "nvcc": gpu_flags},
        extra_link_args=["-fopenmp"])]


class BuildExtension(cpp_extension.BuildExtension.with_options(no_python_abi_suffix=True)):
    """Builds dsv4_ops._C, then writes the build record next to it (_build_info.json): the
    package version, the torch it was built against and the GPU targets. dsv4_ops/_library.py
    checks the torch version before loading the library."""

    def finalize_options(self):
        super().finalize_options()
        if os.environ.get("DSV4_OPS_BUILD_TEMP"):
            self.build_temp = os.path.abspath(os.environ["DSV4_OPS_BUILD_TEMP"])

    def run(self):
        super().run()
        gpu = _gpu_build()
        arch_var = {"cuda": "TORCH_CUDA_ARCH_LIST", "hip": "PYTORCH_ROCM_ARCH"}.get(gpu)
        archs = os.environ.get(arch_var, "") if arch_var else ""
        record = {
            "version": self.distribution.get_version(),
            "torch": str(torch.__version__),
            "gpu": gpu,
            "cuda": torch.version.cuda if gpu == "cuda" else None,
            "hip": torch.version.hip if gpu == "hip" else None,
            "archs": archs.replace(" ", ";").split(";") if archs else [],
        }
        path = os.path.join(os.path.dirname(self.get_ext_fullpath("dsv4_ops._C")), BUILD_RECORD)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")


# Metadata (name, version, dependencies, packages) lives in pyproject.toml.
setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExtension})
