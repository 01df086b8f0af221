#!/usr/bin/env bash
# Compile check of the CUDA kernels on a machine without a GPU (CI): builds the extension
# for sm_90 against torch 2.14.1+cu130 with nvcc 13.0, loads it, and checks that every
# dsv4 op has a CUDA kernel registered, and that the pooling kernels issue their window loads
# together and the store kernels their inputs' loads (scripts/check_load_batching.py); also
# compiles benchmarks/read_floor.cu. A broken CUDA build fails this script.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DSV4_CU_VENV:-.venv-cu130}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check torch==2.14.1 setuptools wheel ninja numpy
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
# The minimal toolkit lacks the cuBLAS/cuSPARSE headers that torch's CUDA headers include;
# the cu130 torch wheel ships them.
NV_INC=$("$VENV/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "include"))')
export CPATH="$NV_INC${CPATH:+:$CPATH}"
OUT=build/cuda-check
rm -rf "$OUT/lib"
TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} DSV4_OPS_FORCE_GPU=1 MAX_JOBS=${MAX_JOBS:-2} \
  "$VENV/bin/python" setup.py -q build_ext -b "$OUT/lib" -t "$OUT/tmp"
"$VENV/bin/python" - "$OUT/lib" <<'PY'
import glob, sys
import torch
lib = glob.glob(f"{sys.argv[1]}/dsv4_ops/_C*.so")
assert lib, "no library built"
torch.ops.load_library(lib[0])
ops = sorted(n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names()
             if n.startswith("dsv4::"))  # every schema of csrc/registration.cpp
missing = [(op, key) for op in ops for key in ("CPU", "CUDA")
           if not torch._C._dispatch_has_kernel_for_dispatch_key(f"dsv4::{op}", key)]
if missing:
    sys.exit(f"check_cuda_build: ops without a kernel: {missing}")
print(f"check_cuda_build: {lib[0]} has CPU and CUDA kernels for all {len(ops)} ops (sm_90, torch {torch.__version__})")
PY
# The benchmarks' read-floor tool (a standalone CUDA program, run by scripts/gpu_session.sh).
"$CUDA_HOME/bin/nvcc" -O3 -std=c++17 -arch=sm_90 -o "$OUT/read_floor" benchmarks/read_floor.cu
echo "check_cuda_build: benchmarks/read_floor.cu compiles (sm_90)"
# The pooling kernels' window loads must stay batched in the machine code (see the script).
CUOBJDUMP=$("$VENV/bin/python" -c 'import os, triton; print(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"))' 2>/dev/null || true)
[ -x "${CUOBJDUMP:-}" ] || CUOBJDUMP="$CUDA_HOME/bin/cuobjdump"
"$VENV/bin/python" scripts/check_load_batching.py "$CUOBJDUMP" "$OUT"/lib/dsv4_ops/_C*.so
