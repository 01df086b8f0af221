#!/usr/bin/env bash
# Run the test suite on a fresh machine: makes .venv (once), installs torch and the test
# dependencies, builds the extension in place (only when something changed), runs pytest.
# Extra arguments go to pytest. The tests marked slow (long serving scenarios, the CMake
# build) are left out unless the arguments choose tests themselves: `-m slow` runs only them,
# `-m ''` everything, a test id (file::name) runs that test.
#   TORCH_SPEC       torch requirement to install (default torch==2.13.0, the CPU build here)
#   DSV4_VENV        environment to use (default .venv); one that has torch keeps it, so on a
#                    GPU machine DSV4_VENV=/path/to/venv-with-cuda-torch tests the CUDA kernels
#   OMP_NUM_THREADS  CPU threads of the kernels (default: half the CPUs, at least one). A
#                    parallel loop waits for its slowest thread, so threads that compete with
#                    other processes for the cores make every loop wait for a descheduled one.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
# shellcheck disable=SC2046  # one package per word
ensure_venv "${DSV4_VENV:-.venv}" $(project_extra test)
build_inplace
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))}
# -q unless the arguments set the verbosity themselves (-q -q would drop the summary line).
verbosity=(-q)
select=(-m "not slow")
for arg in "$@"; do
  case "$arg" in
    -q* | -v* | --quiet | --verbose) verbosity=() ;;
    -m* | *::*) select=() ;;
  esac
done
"$VENV_PY" -m pytest "${verbosity[@]}" "${select[@]}" -p no:cacheprovider "$@"
