#!/usr/bin/env bash
# Run the end-to-end simulated serving demo (CUDA when present, else CPU). Installs what it
# needs into .venv on first use, like scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
ensure_venv "${DSV4_VENV:-.venv}" numpy
build_inplace
"$VENV_PY" examples/serving_demo.py "$@"
