# Shared by scripts/test.sh and scripts/demo.sh: a virtual environment with torch, and an
# in-place build of dsv4_ops/_C.so (pip's build isolation is off so the extension is built
# against the torch it will run with).
#   ensure_venv DIR PACKAGES...   torch comes from $TORCH_SPEC (default torch==2.13.0, the CPU
#                                 build); an environment that already has torch keeps it unless
#                                 TORCH_SPEC is set.
ensure_venv() {
  local dir=$1; shift
  if [ ! -x "$dir/bin/python" ]; then
    python3 -m venv "$dir"
  fi
  VENV_PY=$dir/bin/python
  local torch_req=()
  if [ -n "${TORCH_SPEC:-}" ] || ! "$VENV_PY" -c "import torch" 2>/dev/null; then
    torch_req=("${TORCH_SPEC:-torch==2.13.0}")
  fi
  "$VENV_PY" -m pip install -q --disable-pip-version-check "${torch_req[@]}" setuptools wheel ninja "$@"
}

build_inplace() {
  MAX_JOBS=${MAX_JOBS:-2} "$VENV_PY" -m pip install -q --disable-pip-version-check \
    --no-build-isolation --no-deps -e .
}
