#!/usr/bin/env bash
# A whole GPU test run of dsv4_ops, from the repository root of the GPU machine:
#
#   bash scripts/gpu_session.sh [BUDGET_S]             # every stage, within BUDGET_S seconds
#   STAGES="build test" bash scripts/gpu_session.sh    # some stages (a long run can be split
#   STAGES="bench" bash scripts/gpu_session.sh         # over several calls this way)
#
# Stages (in this order, each optional, a failing stage does not stop the next ones):
#   build      pip install -e . with the CUDA kernels for the GPU's architecture, then checks
#              that every op has a CUDA kernel
#   test       pytest -q over tests/ (junit xml + log)
#   bench      benchmarks/run.py (results.json / results.md / bandwidth.png), then the read
#              floors of the large cases (benchmarks/read_floor.cu, built with nvcc when present;
#              read_floor.md in results.tar.gz and the bench log)
#   peer       benchmarks/peer_compare.py (V4.0 ops), peer_low_ratio.py (V4.1), peer_spec.py
#              (speculative decoding) and peer_fused.py (compress_and_store) against the
#              reference engine's kernels; needs PEER_DIR (benchmarks/README.md says how to
#              make it), skipped without it
#   sanitizer  scripts/sanitize.sh: compute-sanitizer memcheck + racecheck over small CUDA tests
#
# The time budget: BUDGET_S (first argument or environment; default 0: none) is the wall-clock
# budget of the whole run; each stage runs under min(its cap, what is left of the budget less
# RESERVE_S for packing the results), and a stage with less than 20 s left is skipped. Set it
# a little under the machine's own limit when the GPU machine stops long commands.
#
# Environment (all optional):
#   STAGES                default "build test bench peer sanitizer"
#   OUT                   where results go (default ./gpu_out); at most 8 files are written
#                         there: summary.txt run.log results.tar.gz junit.xml results.md
#                         bandwidth.png peer_compare.md sanitizer_summary.txt
#   PYTHON                interpreter (default python3)
#   TORCH_CUDA_ARCH_LIST  CUDA targets of the build (default: the compute capability of GPU 0)
#   MAX_JOBS              parallel compile jobs (default: the CPU count)
#   T_BUILD T_TEST T_BENCH T_PEER T_SANITIZER
#                         per-stage caps in seconds (defaults 420 450 300 300 480: what each
#                         stage needs on one H200 with 16 cores, with some room)
#   RESERVE_S             seconds of the budget kept for packing the results (default 20)
#   AUTO_BUILD=1          build even without the build stage when dsv4_ops has no CUDA kernels
#                         (default 1)
#   BUILD_MODE            pip (default) | inplace (setup.py build_ext --inplace: incremental)
#   DSV4_KEEP_CXX=1       keep CC / CXX / CUDAHOSTCXX as they are (see below)
#   PYTEST_ARGS           extra pytest arguments (e.g. "-x" or "-k cuda")
#   BENCH_ARGS            extra benchmarks/run.py arguments (e.g. "--quick", "--only compress")
#   PEER_DIR              the peer kit (sgl_bench.py, stubs/, wheels/; benchmarks/README.md)
#   PEER_SITE             where the peer wheels are installed (default /tmp/dsv4_peer_site)
#   PEER_ARGS             extra benchmarks/peer_compare.py arguments (e.g. "--quick")
#   PEER_LR_ARGS          extra benchmarks/peer_low_ratio.py arguments (e.g. "--quick")
#   PEER_SPEC_ARGS        extra benchmarks/peer_spec.py arguments (e.g. "--quick")
#   PEER_FUSED_ARGS       extra benchmarks/peer_fused.py arguments (e.g. "--quick")
#   SAN_*                 see scripts/sanitize.sh
# Exit status: the number of failed stages (0 = all requested stages passed).
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
export ROOT
# Build with the system toolchain: a g++ that links libstdc++ statically into shared objects
# (as some images' CC / CXX / CUDAHOSTCXX do) makes an extension that crashes in std::ostream
# as soon as an op formats an error message.
if [ -x /usr/bin/g++ ] && [ -z "${DSV4_KEEP_CXX:-}" ]; then
  export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
fi
export PY=${PYTHON:-python3}
export OUT=${OUT:-$ROOT/gpu_out}
export WORK=${WORK:-/tmp/dsv4_gpu_run}
STAGES=${STAGES:-"build test bench peer sanitizer"}
BUDGET_S=${1:-${BUDGET_S:-0}}
T_BUILD=${T_BUILD:-420}
T_TEST=${T_TEST:-450}
T_BENCH=${T_BENCH:-300}
T_PEER=${T_PEER:-300}
T_SANITIZER=${T_SANITIZER:-480}
AUTO_BUILD=${AUTO_BUILD:-1}
export BUILD_MODE=${BUILD_MODE:-pip}
export PYTEST_ARGS=${PYTEST_ARGS:-}
export BENCH_ARGS=${BENCH_ARGS:-}
export PEER_ARGS=${PEER_ARGS:-}
export PEER_DIR=${PEER_DIR:-}
export PEER_SITE=${PEER_SITE:-/tmp/dsv4_peer_site}
export PEER_LR_ARGS=${PEER_LR_ARGS:-}
export PEER_SPEC_ARGS=${PEER_SPEC_ARGS:-}
export PEER_FUSED_ARGS=${PEER_FUSED_ARGS:-}
export PYTHONUNBUFFERED=1
RESERVE_S=${RESERVE_S:-20}

T_START=$(date +%s)
DEADLINE=$((BUDGET_S > 0 ? T_START + BUDGET_S : 0))
mkdir -p "$OUT"
rm -rf "$WORK"
mkdir -p "$WORK"
SUMMARY="$WORK/summary.txt"
: > "$SUMMARY"
FAILED=0

say() { echo "[gpu_session $(date +%H:%M:%S)] $*"; }
want() { case " $STAGES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# ---------------------------------------------------------------------------------------
# stage bodies (run in a child bash under `timeout`, output to $WORK/<stage>.log)
# ---------------------------------------------------------------------------------------
check_cuda_ops() {
  "$PY" - <<'EOF'
import sys, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(0))
import dsv4_ops
from dsv4_ops import _library as L
print("library", L.LIBRARY_PATH)
missing = [op for op in L.OP_NAMES if not L.has_kernel(op, "CUDA")]
print(f"CUDA kernels: {len(L.OP_NAMES) - len(missing)}/{len(L.OP_NAMES)} ops" + (f"; missing {missing}" if missing else ""))
sys.exit(1 if missing else 0)
EOF
}

stage_build() {
  if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
    TORCH_CUDA_ARCH_LIST=$("$PY" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability(0))') ||
      { echo "no CUDA device to take the architecture from: set TORCH_CUDA_ARCH_LIST"; return 1; }
  fi
  export TORCH_CUDA_ARCH_LIST
  export MAX_JOBS=${MAX_JOBS:-$(nproc)}
  echo "building for TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST with MAX_JOBS=$MAX_JOBS"
  nvcc --version 2>/dev/null | tail -1
  local rc=1
  if [ "$BUILD_MODE" = pip ]; then
    "$PY" -m pip install --no-build-isolation --no-deps --no-index -e . 2>&1 | tail -40
    rc=${PIPESTATUS[0]}
    if [ "$rc" != 0 ]; then
      echo "pip install -e failed (rc $rc); falling back to setup.py build_ext --inplace"
    fi
  fi
  if [ "$rc" != 0 ]; then
    "$PY" setup.py build_ext --inplace 2>&1 | tail -60
    rc=${PIPESTATUS[0]}
  fi
  [ "$rc" != 0 ] && { echo "build failed (rc $rc)"; return "$rc"; }
  check_cuda_ops
}

stage_test() {
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader 2>/dev/null
  # shellcheck disable=SC2086
  "$PY" -m pytest -q -rfE -p no:cacheprovider --durations=15 --junitxml="$WORK/junit.xml" tests $PYTEST_ARGS
}

stage_bench() {
  local budget=$(( STAGE_TIMEOUT - 90 ))
  [ "$budget" -lt 30 ] && budget=30
  # shellcheck disable=SC2086
  "$PY" benchmarks/run.py --out "$WORK/bench" --budget-s "$budget" $BENCH_ARGS
  local rc=$?
  if command -v nvcc >/dev/null && mkdir -p "$WORK/bench" &&
     nvcc -O3 -std=c++17 -arch=native -o "$WORK/read_floor" benchmarks/read_floor.cu; then
    "$WORK/read_floor" | tee "$WORK/bench/read_floor.md"
  fi
  return $rc
}

stage_peer() {
  if [ -z "$PEER_DIR" ] || [ ! -f "$PEER_DIR/sgl_bench.py" ]; then
    echo "SKIP: no peer kit (set PEER_DIR to a folder with sgl_bench.py, stubs/ and wheels/;"
    echo "      benchmarks/README.md says how to obtain it)"
    return 200
  fi
  local peer
  peer=$(cd "$PEER_DIR" && pwd)
  if ls "$peer"/wheels/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$PEER_SITE" "$peer"/wheels/*.whl 2>&1 | grep -v "WARNING: Target directory" | tail -20
  else
    echo "warning: no $peer/wheels/*.whl; relying on what $PEER_SITE holds"
  fi
  # A quarter of the stage for each script (a budget stops new cases, not the running one).
  local budget=$(( (STAGE_TIMEOUT - 120) / 4 )) rc=0
  [ "$budget" -lt 30 ] && budget=30
  local pp="$peer/stubs:$PEER_SITE${PYTHONPATH:+:$PYTHONPATH}"
  # shellcheck disable=SC2086
  PYTHONPATH="$pp" "$PY" benchmarks/peer_compare.py --peer-dir "$peer" --out "$WORK/peer" \
    --budget-s "$budget" $PEER_ARGS || rc=$?
  # shellcheck disable=SC2086
  PYTHONPATH="$pp" "$PY" -m benchmarks.peer_low_ratio --peer-dir "$peer" --out "$WORK/peer" \
    --budget-s "$budget" $PEER_LR_ARGS || rc=$?
  # shellcheck disable=SC2086
  PYTHONPATH="$pp" "$PY" -m benchmarks.peer_spec --peer-dir "$peer" --out "$WORK/peer" \
    --budget-s "$budget" ${PEER_SPEC_ARGS:-} || rc=$?
  # shellcheck disable=SC2086
  PYTHONPATH="$pp" "$PY" -m benchmarks.peer_fused --peer-dir "$peer" --out "$WORK/peer" \
    --budget-s "$budget" ${PEER_FUSED_ARGS:-} || rc=$?
  return $rc
}

stage_sanitizer() {
  SAN_TIMEOUT=${SAN_TIMEOUT:-$(( (STAGE_TIMEOUT - 30) / 2 ))} bash scripts/sanitize.sh "$WORK/sanitizer"
}

export -f check_cuda_ops stage_build stage_test stage_bench stage_peer stage_sanitizer

# ---------------------------------------------------------------------------------------
# stage runner, key lines, result collection
# ---------------------------------------------------------------------------------------
key_lines() {  # the lines of a stage log worth a summary
  local log=$1 l
  case $2 in
    build) grep -E "CUDA kernels:|build failed|error:|Error" "$log" | head -5 ;;
    test) grep -E "^(FAILED|ERROR) " "$log" | head -15
          l=$(grep -E "(passed|failed|error|no tests ran).* in [0-9.]+s" "$log" | tail -1)
          if [ -n "$l" ]; then echo "$l"; else grep -E "^E  " "$log" | head -3; fi ;;
    bench) grep -E "^\[ceiling\]|rows in|^NOTE|device lost|not importable|^copy bandwidth|^\| (cr|fp8)" "$log" | head -15 ;;
    peer) grep -E "^SKIP|^\[ceiling\]|^checks |^summary:|^SUMMARY|cannot|CUDA context|^\[jit\]|^\[graph\]" "$log" | head -15 ;;
    sanitizer) grep -E "^sanitize [a-z]+:|tests selected|not found" "$log" | head -10 ;;
  esac
}

run_stage() {
  local name=$1 cap=$2
  if ! want "$name"; then
    return 0
  fi
  local now left t=$cap
  if [ "$DEADLINE" -gt 0 ]; then
    now=$(date +%s)
    left=$(( DEADLINE - now - RESERVE_S ))
    t=$(( cap < left ? cap : left ))
  fi
  if [ "$t" -lt 20 ]; then
    printf '%-10s %-22s %5ss\n' "$name" "SKIPPED (no time left)" 0 >> "$SUMMARY"
    say "stage $name skipped: no time left"
    FAILED=$((FAILED + 1))
    return 0
  fi
  say "=== stage $name (timeout ${t}s)"
  local t0 rc status
  t0=$(date +%s)
  STAGE_TIMEOUT=$t timeout -k 15 "$t" bash -c "stage_$name" > "$WORK/$name.log" 2>&1
  rc=$?
  case $rc in
    0) status="ok" ;;
    200) status="SKIPPED" ;;
    124|137) status="TIMEOUT (${t}s)"; FAILED=$((FAILED + 1)) ;;
    *) status="FAILED (rc $rc)"; FAILED=$((FAILED + 1)) ;;
  esac
  local dt=$(( $(date +%s) - t0 ))
  printf '%-10s %-22s %5ss\n' "$name" "$status" "$dt" >> "$SUMMARY"
  key_lines "$WORK/$name.log" "$name" | sed 's/^/           | /' >> "$SUMMARY"
  say "stage $name: $status in ${dt}s; last lines:"
  tail -n 12 "$WORK/$name.log" | cut -c1-220
  collect
}

# HEAD and the tree hash of the files as they are (benchmarks/common.py git_tree), once.
GIT_TREE=$(cd "$ROOT" && "$PY" -c 'from benchmarks.common import git_tree; print(git_tree())' \
           2>/dev/null || echo '?')

collect() {  # (re)build the <= 8 files under $OUT from what $WORK holds so far
  {
    echo "dsv4_ops GPU run $(date '+%Y-%m-%d %H:%M:%S'), git $GIT_TREE, stages: $STAGES"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1
    echo
    cat "$SUMMARY"
  } > "$OUT/summary.txt"
  local s f
  : > "$OUT/run.log"
  for s in build test bench peer sanitizer; do
    f="$WORK/$s.log"
    [ -f "$f" ] || continue
    echo "######## $s" >> "$OUT/run.log"
    tail -c 2500000 "$f" >> "$OUT/run.log"
  done
  [ -f "$WORK/junit.xml" ] && cp "$WORK/junit.xml" "$OUT/junit.xml"
  [ -f "$WORK/bench/results.md" ] && cp "$WORK/bench/results.md" "$OUT/results.md"
  [ -f "$WORK/bench/bandwidth.png" ] && cp "$WORK/bench/bandwidth.png" "$OUT/bandwidth.png"
  [ -f "$WORK/peer/peer_compare.md" ] && cp "$WORK/peer/peer_compare.md" "$OUT/peer_compare.md"
  [ -f "$WORK/sanitizer/sanitizer_summary.txt" ] && cp "$WORK/sanitizer/sanitizer_summary.txt" "$OUT/sanitizer_summary.txt"
  # everything (json, full logs, sanitizer reports) in one archive, kept under 15 MiB
  tar -czf "$OUT/results.tar.gz" -C "$(dirname "$WORK")" "$(basename "$WORK")" 2>/dev/null
  if [ "$(stat -c %s "$OUT/results.tar.gz" 2>/dev/null || echo 0)" -gt 15000000 ]; then
    tar -czf "$OUT/results.tar.gz" -C "$(dirname "$WORK")" --exclude='*.log' "$(basename "$WORK")" 2>/dev/null
  fi
}

# ---------------------------------------------------------------------------------------
say "root $ROOT, out $OUT, stages: $STAGES, budget ${BUDGET_S}s (0: none), python $("$PY" -c 'import sys; print(sys.version.split()[0])')"
if ! want build && [ "$AUTO_BUILD" = 1 ] && { want test || want bench || want peer || want sanitizer; }; then
  if ! check_cuda_ops > "$WORK/precheck.log" 2>&1; then
    say "dsv4_ops has no CUDA kernels here (see precheck); adding the build stage"
    tail -3 "$WORK/precheck.log"
    STAGES="build $STAGES"
  fi
fi
run_stage build "$T_BUILD"
if want build && ! grep -q "^build *ok" "$SUMMARY"; then
  say "build failed: later stages still run (they will report what works)"
fi
run_stage test "$T_TEST"
run_stage bench "$T_BENCH"
run_stage peer "$T_PEER"
run_stage sanitizer "$T_SANITIZER"
collect

echo
echo "==================== gpu_session summary ($(( $(date +%s) - T_START ))s) ===================="
cat "$SUMMARY"
echo "files under $OUT:"
ls -la "$OUT" | tail -n +2
exit "$FAILED"
