#!/usr/bin/env bash
# compute-sanitizer over a small, representative subset of the CUDA tests.
#
#   bash scripts/sanitize.sh [OUTDIR]
#
# For each tool in SAN_TOOLS (default "memcheck racecheck") runs
#   compute-sanitizer --tool TOOL python -m pytest -q SAN_TESTS -k SAN_K
# writing OUTDIR/TOOL.log, and prints one verdict line per tool. Environment:
#   PYTHON          interpreter (default python3)
#   SAN_TOOLS       tools to run (memcheck racecheck synccheck initcheck)
#   SAN_TESTS       test files (default: tests/test_{plan,compress,store}.py that exist, else tests)
#   SAN_K           pytest -k expression selecting small CUDA cases (see default below)
#   SAN_DEVICE      the device id token the default selection requires (cuda)
#   SAN_TIMEOUT     seconds per tool (default 240)
#   SAN_EXTRA       extra pytest arguments
#   COMPUTE_SANITIZER  path of the compute-sanitizer binary
#   DSV4_OPS_TEST_STALE_PLAN=1  every store-kernel plan guess wrong: a hook that only a test
#                   build has, so the extension is first rebuilt in place as one
#                   (DSV4_OPS_TEST_HOOKS=1, see setup.py) and as a production build at the end
# Exit status: 0 when every tool ran clean over a non-empty selection, 1 otherwise.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
OUTDIR=${1:-$ROOT/sanitizer_out}
mkdir -p "$OUTDIR"
PY=${PYTHON:-python3}
SAN_TOOLS=${SAN_TOOLS:-"memcheck racecheck"}
SAN_TIMEOUT=${SAN_TIMEOUT:-240}
SAN_EXTRA=${SAN_EXTRA:-}
# Small CUDA cases, a few per kernel family: every planner kind, offline and online pooling in
# fp32 and bf16, long padded plans, every store format for decode and prefill, and the tests
# that feed negative / out-of-range slots, pages and locs (where an out-of-bounds access would
# show). No graph capture, torch.compile, big-batch or hypothesis tests (slow under
# instrumentation).
# SAN_K=cuda selects every CUDA-parametrised test instead.
SAN_DEVICE=${SAN_DEVICE:-cuda}
DEFAULT_K="test_plan_decode_matches_oracle or test_plan_prefill_matches_oracle"
DEFAULT_K="$DEFAULT_K or test_plan_online_prefill_matches_oracle or test_plan_online_decode_matches_oracle"
DEFAULT_K="$DEFAULT_K or test_out_of_range_lookups_are_absent or test_prefill_negative_full_to_state"
DEFAULT_K="$DEFAULT_K or test_plan_odd_ring_and_page_sizes or test_plan_request_ring_near_int32_positions"
DEFAULT_K="$DEFAULT_K or test_plan_slots_past_int32"
DEFAULT_K="$DEFAULT_K or (test_offline_sequences and (sfloat32-ifloat32-ofloat32 or sbfloat16-ibfloat16-obfloat16))"
DEFAULT_K="$DEFAULT_K or (test_online_sequences and sfloat32-ifloat32-ofloat32)"
DEFAULT_K="$DEFAULT_K or test_prefill_compress_reads_before_writes or test_negative_and_out_of_range_are_skipped"
DEFAULT_K="$DEFAULT_K or test_prefill_first_window_ignores_state_rows or test_online_merge_ignores_absent_state"
DEFAULT_K="$DEFAULT_K or test_decode_rows or test_inactive_rows_write_nothing or test_against_dsv4_reference_store"
DEFAULT_K="$DEFAULT_K or (test_prefill_matches_oracle and 0-64 and not test_plan)"
# long padded plans: pooling blocks that take several records in turn (shared-memory records)
DEFAULT_K="$DEFAULT_K or padded_prefill_many_records or (test_padded_prefill_strided_blocks and 4-17000)"
# cr 128 decode blocks that take several requests (shared-memory records, copies, then pools)
DEFAULT_K="$DEFAULT_K or (test_c128_decode_request_groups and 128-at)"
# ... and their scan over a step of several rounds of plan records (shared counts per round)
DEFAULT_K="$DEFAULT_K or test_c128_decode_uneven_closings"
# the decode window row the step writes, from an input of another dtype; ape of every dtype
DEFAULT_K="$DEFAULT_K or test_decode_uses_state_rounded_new_row or test_ape_dtypes"
SAN_K=${SAN_K:-"$SAN_DEVICE and ($DEFAULT_K)"}

if [ -z "${SAN_TESTS:-}" ]; then
  SAN_TESTS=""
  for f in tests/test_plan.py tests/test_compress.py tests/test_store.py; do
    [ -f "$f" ] && SAN_TESTS="$SAN_TESTS $f"
  done
  [ -z "$SAN_TESTS" ] && SAN_TESTS="tests"
fi

find_sanitizer() {
  if [ -n "${COMPUTE_SANITIZER:-}" ] && [ -x "$COMPUTE_SANITIZER" ]; then echo "$COMPUTE_SANITIZER"; return; fi
  if command -v compute-sanitizer >/dev/null 2>&1; then command -v compute-sanitizer; return; fi
  local c
  for c in "${CUDA_HOME:-/nonexistent}/bin/compute-sanitizer" /usr/local/cuda/bin/compute-sanitizer \
           /usr/local/cuda/compute-sanitizer/compute-sanitizer /usr/local/cuda-*/bin/compute-sanitizer; do
    [ -x "$c" ] && { echo "$c"; return; }
  done
  c=$("$PY" - <<'EOF' 2>/dev/null
import glob, os, sys
for p in sys.path:
    for hit in glob.glob(os.path.join(p, "nvidia", "*", "bin", "compute-sanitizer")) + \
               glob.glob(os.path.join(p, "nvidia", "cuda_sanitizer_api", "compute-sanitizer", "compute-sanitizer")):
        if os.access(hit, os.X_OK):
            print(hit); sys.exit(0)
EOF
)
  [ -n "$c" ] && echo "$c"
}

SAN=$(find_sanitizer)
if [ -z "$SAN" ]; then
  echo "sanitize: compute-sanitizer not found (set COMPUTE_SANITIZER)" | tee "$OUTDIR/sanitizer_summary.txt"
  exit 1
fi
echo "sanitize: $SAN ($("$SAN" --version 2>/dev/null | tail -1))"

rebuild_inplace() {  # $1: 1 for a test build, 0 for a production build
  DSV4_OPS_TEST_HOOKS=$1 MAX_JOBS=${MAX_JOBS:-$(nproc)} "$PY" setup.py -q build_ext --inplace \
    > "$OUTDIR/build_hooks$1.log" 2>&1
}
if [ "${DSV4_OPS_TEST_STALE_PLAN:-0}" = 1 ]; then
  echo "sanitize: DSV4_OPS_TEST_STALE_PLAN=1: rebuilding in place as a test build (DSV4_OPS_TEST_HOOKS=1)"
  rebuild_inplace 1 || { echo "sanitize: the test build failed (see $OUTDIR/build_hooks1.log)"; exit 1; }
  trap 'echo "sanitize: rebuilding the production build"; rebuild_inplace 0 ||
        echo "sanitize: the production rebuild failed (see $OUTDIR/build_hooks0.log)"' EXIT
fi
echo "sanitize: tests: $SAN_TESTS  -k \"$SAN_K\""

# What the selection holds (without the sanitizer: fast)
# shellcheck disable=SC2086
"$PY" -m pytest -q --collect-only -p no:cacheprovider $SAN_TESTS -k "$SAN_K" $SAN_EXTRA > "$OUTDIR/selection.txt" 2>&1
n_sel=$(grep -c '::' "$OUTDIR/selection.txt" || true)
echo "sanitize: $n_sel tests selected (list in selection.txt)"

# Allocations straight from cudaMalloc, so memcheck sees out-of-bounds accesses that the
# caching allocator would otherwise hide inside larger blocks; few hypothesis examples.
export PYTORCH_NO_CUDA_MEMORY_CACHING=1
export DSV4_HYPOTHESIS_EXAMPLES=${DSV4_HYPOTHESIS_EXAMPLES:-3}
export CUDA_MODULE_LOADING=LAZY

status=0
: > "$OUTDIR/sanitizer_summary.txt"
for tool in $SAN_TOOLS; do
  extra=""
  [ "$tool" = memcheck ] && extra="--leak-check no"
  t0=$(date +%s)
  # shellcheck disable=SC2086
  timeout -k 15 "$SAN_TIMEOUT" "$SAN" --tool "$tool" $extra --error-exitcode 99 --print-limit 100 \
      --target-processes all "$PY" -m pytest -q -p no:cacheprovider -x $SAN_TESTS -k "$SAN_K" $SAN_EXTRA \
      > "$OUTDIR/$tool.log" 2>&1
  rc=$?
  dt=$(( $(date +%s) - t0 ))
  errs=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUTDIR/$tool.log" | tail -1)
  tests=$(grep -E "(passed|failed|error|no tests ran).* in [0-9.]+s" "$OUTDIR/$tool.log" | tail -1)
  case $rc in
    0) verdict="clean" ;;
    99) verdict="SANITIZER ERRORS"; status=1 ;;
    124|137) verdict="TIMEOUT after ${SAN_TIMEOUT}s"; status=1 ;;
    5) verdict="NO TESTS SELECTED"; status=1 ;;
    *) verdict="TESTS FAILED (rc $rc)"; status=1 ;;
  esac
  line="sanitize $tool: $verdict in ${dt}s; ${errs:-no sanitizer summary}; pytest: ${tests:-?}"
  echo "$line" | tee -a "$OUTDIR/sanitizer_summary.txt"
  if [ "$rc" != 0 ]; then
    grep -nE "^=========  (Invalid|Race|Error|Uninitialized|Barrier)|^E   |FAILED" "$OUTDIR/$tool.log" | head -20
  fi
done
exit $status
