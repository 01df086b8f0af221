#!/usr/bin/env bash
# Run the test suite on a fresh machine: makes .venv (once), installs torch and the test
# dependencies, builds the extension in place, runs pytest. Extra arguments go to pytest.
#   TORCH_SPEC   torch requirement to install (default torch==2.13.0, the CPU build here;
#                on a GPU machine keep the CUDA torch you have: DSV4_VENV=/path/to/venv)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
ensure_venv "${DSV4_VENV:-.venv}" "${TORCH_SPEC:-torch==2.13.0}" pytest hypothesis numpy expecttest
build_inplace
"$VENV_PY" -m pytest -q -p no:cacheprovider "$@"
