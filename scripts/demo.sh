#!/usr/bin/env bash
# Run the end-to-end simulated serving demo (CUDA when present, else CPU). Installs what it
# needs into .venv on first use, like scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
ensure_venv "${DSV4_VENV:-.venv}" "${TORCH_SPEC:-torch==2.13.0}" numpy
build_inplace
"$VENV_PY" examples/serving_demo.py "$@"
