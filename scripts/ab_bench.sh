#!/usr/bin/env bash
# Benchmark a change against a baseline on one GPU machine, in one run: builds both trees in
# place (timed, the same MAX_JOBS and architectures), runs benchmarks/run.py on each and
# writes the ratio table (benchmarks/compare.py).
#
#   bash scripts/ab_bench.sh BASE_TREE [OUT_DIR]      # e.g. BASE_TREE from `git archive`
#
# Environment: MAX_JOBS (default 16), TORCH_CUDA_ARCH_LIST (default 9.0), BENCH_ARGS (extra
# run.py arguments, default --quick), STAGES (default "build bench"), ROUNDS (bench rounds,
# each runs base then new; default 1), PYTHON (default python3).
set -u -o pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BASE=$(cd "${1:?usage: ab_bench.sh BASE_TREE [OUT_DIR]}" && pwd)
OUT=${2:-$ROOT/ab_out}
PY=${PYTHON:-python3}
STAGES=${STAGES:-"build bench"}
mkdir -p "$OUT"
# A toolchain whose libstdc++ is shared (see scripts/gpu_session.sh).
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++; fi
export MAX_JOBS=${MAX_JOBS:-16} TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}

build() {  # build TREE NAME: a clean in-place build, its wall time in OUT/build_times.txt
  local t0 t1
  (cd "$1" && rm -rf build dsv4_ops/_C*.so)
  t0=$(date +%s%N)
  if (cd "$1" && "$PY" setup.py build_ext --inplace > "$OUT/build_$2.log" 2>&1); then
    t1=$(date +%s%N)
    printf '%s build: %d.%d s (MAX_JOBS=%s, TORCH_CUDA_ARCH_LIST=%s)\n' "$2" \
      $(( (t1 - t0) / 1000000000 )) $(( (t1 - t0) / 100000000 % 10 )) "$MAX_JOBS" "$TORCH_CUDA_ARCH_LIST" | tee -a "$OUT/build_times.txt"
  else
    echo "$2 build FAILED (see build_$2.log)" | tee -a "$OUT/build_times.txt"; tail -30 "$OUT/build_$2.log"
  fi
}

case " $STAGES " in *" build "*)
  build "$BASE" base
  build "$ROOT" new ;;
esac
case " $STAGES " in *" bench "*)
  for r in $(seq 1 "${ROUNDS:-1}"); do
    for side in base new; do
      tree=$ROOT; [ "$side" = base ] && tree=$BASE
      # shellcheck disable=SC2086
      (cd "$tree" && "$PY" benchmarks/run.py ${BENCH_ARGS:---quick} --out "$OUT/${side}_$r") \
        > "$OUT/bench_${side}_$r.log" 2>&1 || echo "$side round $r: run.py exit $?"
    done
    "$PY" "$ROOT/benchmarks/compare.py" "$OUT/base_$r/results.json" "$OUT/new_$r/results.json" \
      --out "$OUT/compare_$r.md" | tail -3
  done ;;
esac
