#!/usr/bin/env bash
# HIP compile check (CI): hipify the torch-free device code with torch's hipify, then compile
# every kernel family for gfx90a with Debian's ROCm 5.2 hipcc into AMDGPU code objects and
# check that each object holds a kernel for every instantiation. The sources compiled here are
# the headers the torch extension includes (csrc/include/dsv4/{compress,plan,store}/*.cuh), not
# copies; scripts/hip/*_instances.cu only instantiate their templates (hipified along with
# csrc/).
set -euo pipefail
cd "$(dirname "$0")/.."
ARCH=${HIP_ARCH:-gfx90a}
PY=${DSV4_PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
if ! command -v hipcc >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hipcc >/dev/null
fi
export HIP_PLATFORM=amd
READELF=$(ls /usr/lib/llvm-*/bin/llvm-readelf | sort -V | tail -1)
CXXFILT=$(ls /usr/lib/llvm-*/bin/llvm-cxxfilt | sort -V | tail -1)
OUT=build/hip-check
rm -rf "$OUT" && mkdir -p "$OUT"
cp -r csrc "$OUT/csrc"
mkdir -p "$OUT/csrc/hip_check" && cp scripts/hip/*_instances.cu "$OUT/csrc/hip_check/"
"$PY" - "$(pwd)/$OUT/csrc" <<'PY'
import sys
from torch.utils.hipify import hipify_python
hipify_python.hipify(project_directory=sys.argv[1], output_directory=sys.argv[1],
                     includes=["*"], is_pytorch_extension=True, show_detailed=False,
                     show_progress=False)
PY
status=0
for tu in "$OUT"/csrc/hip_check/*_instances.hip; do
  fam=$(basename "$tu" _instances.hip)
  obj="$OUT/$fam.$ARCH.co"
  if ! hipcc -std=c++17 -O3 --offload-arch="$ARCH" --cuda-device-only --no-gpu-bundle-output \
       -I "$OUT/csrc" -x hip -c "$tu" -o "$obj" 2> "$OUT/$fam.log"; then
    echo "check_hip: $fam FAILED to compile for $ARCH:"; cat "$OUT/$fam.log"; status=1; continue
  fi
  # Every explicit instantiation of the TU (macros expanded) must be a kernel in the object.
  expected=$(hipcc -std=c++17 --offload-arch="$ARCH" --cuda-device-only -E -P -I "$OUT/csrc" -x hip "$tu" \
             | grep -o 'template __attribute__((global)) void' | wc -l || true)
  kernels=$("$READELF" -sW "$obj" | awk '$4 == "OBJECT" && $8 ~ /\.kd$/ {print $8}' | sort -u)
  nk=$(printf '%s\n' "$kernels" | grep -c . || true)
  machine=$("$READELF" -h "$obj" | awk -F: '/Machine/ {gsub(/ /, "", $2); print $2}')
  if [ "$machine" != "EM_AMDGPU" ] || [ "$nk" -lt "$expected" ] || [ "$expected" -eq 0 ]; then
    echo "check_hip: $fam: expected $expected AMDGPU kernels, found $nk (machine $machine)"; status=1
  else
    echo "check_hip: $fam: $nk AMDGPU kernels for $ARCH"
    printf '%s\n' "$kernels" | sed 's/\.kd$//' | "$CXXFILT" | sed 's/^/    /' | cut -c1-110
  fi
done
exit $status
