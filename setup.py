"""Build dsv4_ops: one torch extension with the CPU kernels, plus the CUDA kernels when the
installed torch has CUDA (or, through torch's hipify, ROCm).

    pip install --no-build-isolation .      # build isolation would pull another torch

Environment:
    DSV4_OPS_CPU_ONLY=1        build the CPU kernels only, even with a CUDA/ROCm torch
    DSV4_OPS_FORCE_GPU=1       build the GPU kernels even where no GPU toolkit is detected
    DSV4_OPS_TEST_HOOKS=1      a test build: the GPU kernels' test hooks (see below)
    TORCH_CUDA_ARCH_LIST       CUDA targets (default "8.0;9.0;10.0")
    PYTORCH_ROCM_ARCH          ROCm targets (default "gfx90a;gfx942")
    MAX_JOBS                   parallel compile jobs
"""
import glob
import os

from setuptools import find_packages, setup
import torch
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))


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
    return [cpp_extension.CUDAExtension(
        "dsv4_ops._C", sources, include_dirs=include_dirs,
        extra_compile_args={"cxx": cxx, "nvcc": gpu_flags},
        extra_link_args=["-fopenmp"])]


setup(
    name="dsv4_ops",
    version="0.1.0",
    description="DeepSeek-V4 KV-cache compressor kernels as PyTorch custom operators",
    packages=find_packages(include=["dsv4_ops", "dsv4_ops.*"]),
    ext_modules=extensions(),
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(no_python_abi_suffix=True)},
    python_requires=">=3.10",
    install_requires=["torch>=2.6"],
    zip_safe=False,
)
