#!/usr/bin/env bash
# Run the test suite on a fresh machine: makes .venv (once), installs torch and the test
# dependencies, builds the extension in place, runs pytest. Extra arguments go to pytest.
#   TORCH_SPEC   torch requirement to install (default torch==2.13.0, the CPU build here)
#   DSV4_VENV    environment to use (default .venv); one that has torch keeps it, so on a
#                GPU machine DSV4_VENV=/path/to/venv-with-cuda-torch tests the CUDA kernels
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
ensure_venv "${DSV4_VENV:-.venv}" pytest hypothesis numpy expecttest
build_inplace
# -q unless the arguments set the verbosity themselves (-q -q would drop the summary line).
verbosity=(-q)
for arg in "$@"; do
  case "$arg" in -q* | -v* | --quiet | --verbose) verbosity=() ;; esac
done
"$VENV_PY" -m pytest "${verbosity[@]}" -p no:cacheprovider "$@"
