#!/usr/bin/env bash
# Packaging check: `pip wheel --no-build-isolation --no-deps` builds a wheel of the working
# tree against the torch of $DSV4_VENV (default .venv, made as scripts/test.sh makes it), the
# wheel goes into a fresh virtual environment that gets only that same torch (from pip's
# cache when it is there), and scripts/wheel_smoke.py runs in it, outside the source tree.
# The wheel is built from a copy of the tracked and untracked-but-not-ignored files, so that
# nothing of an earlier build (build/, dsv4_ops/_C.so) can end up in it.
#   DSV4_VENV   build environment (default .venv)
#   KEEP_WORK=1 keep the work folder (the wheel, the logs, the environment)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
source scripts/_venv.sh
ensure_venv "${DSV4_VENV:-.venv}"
BUILD_PY=$(realpath -s "$VENV_PY")
WORK=$(mktemp -d "${TMPDIR:-/tmp}/dsv4_wheel.XXXXXX")
if [ "${KEEP_WORK:-0}" != 1 ]; then trap 'rm -rf "$WORK"' EXIT; fi
mkdir -p "$WORK/src"
git ls-files -z --cached --others --exclude-standard |
  (while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done) |
  tar --null -T - -cf - | tar -xf - -C "$WORK/src"

t0=$SECONDS
echo "check_wheel: building the wheel (a full build of the extension: about a minute on 2 cores; log: $WORK/wheel.log)..."
if ! (cd "$WORK/src" && MAX_JOBS=${MAX_JOBS:-2} "$BUILD_PY" -m pip wheel \
        --disable-pip-version-check --no-build-isolation --no-deps -w "$WORK/dist" .) \
        > "$WORK/wheel.log" 2>&1; then
  tail -n 40 "$WORK/wheel.log"
  echo "check_wheel: the wheel did not build" >&2
  exit 1
fi
wheel=$(ls "$WORK"/dist/dsv4_ops-*.whl)
echo "check_wheel: built $(basename "$wheel") in $((SECONDS - t0)) s"

torch_version=$("$BUILD_PY" -c 'import importlib.metadata as m; print(m.version("torch"))')
python3 -m venv "$WORK/venv"
echo "check_wheel: installing torch==$torch_version and the wheel into a fresh environment"
"$WORK/venv/bin/python" -m pip install -q --disable-pip-version-check "torch==$torch_version" "$wheel"
(cd "$WORK" && "$WORK/venv/bin/python" "$ROOT/scripts/wheel_smoke.py")
echo "check_wheel: ok"
