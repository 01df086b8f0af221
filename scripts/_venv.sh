# Shared by scripts/test.sh and scripts/demo.sh: a virtual environment with torch, and an
# in-place build of dsv4_ops/_C.so (pip's build isolation is off so the extension is built
# against the torch it will run with).
ensure_venv() {
  local dir=$1 torch_spec=$2; shift 2
  if [ ! -x "$dir/bin/python" ]; then
    python3 -m venv "$dir"
  fi
  VENV_PY=$dir/bin/python
  "$VENV_PY" -m pip install -q --disable-pip-version-check "$torch_spec" setuptools wheel ninja "$@"
}

build_inplace() {
  MAX_JOBS=${MAX_JOBS:-2} "$VENV_PY" -m pip install -q --disable-pip-version-check \
    --no-build-isolation --no-deps -e .
}
