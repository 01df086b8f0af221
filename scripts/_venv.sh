# Shared by scripts/test.sh and scripts/demo.sh: a virtual environment with torch, and an
# editable build of dsv4_ops/_C.so (pip's build isolation is off so the extension is built
# against the torch it will run with).
#   project_extra NAME            the packages of pyproject.toml's optional dependencies NAME
#   ensure_venv DIR PACKAGES...   torch comes from $TORCH_SPEC (default torch==2.13.0, the CPU
#                                 build); an environment that already has torch keeps it unless
#                                 TORCH_SPEC is set.
#   build_inplace                 builds only when the sources, the build settings, the torch or
#                                 the environment changed since the last build (a stamp under
#                                 build/), and then recompiles only what changed (ninja, objects
#                                 kept in build/editable).
project_extra() {
  python3 - "$1" <<'PY'
import sys
try:
    import tomllib
except ImportError:  # Python 3.10: pip's own copy of the same parser
    from pip._vendor import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    print(" ".join(tomllib.load(f)["project"]["optional-dependencies"][sys.argv[1]]))
PY
}

ensure_venv() {
  local dir=$1; shift
  if [ ! -x "$dir/bin/python" ]; then
    echo "creating the virtual environment $dir"
    python3 -m venv "$dir"
  fi
  VENV_PY=$dir/bin/python
  local torch_req=() want=()
  if [ -n "${TORCH_SPEC:-}" ] || ! "$VENV_PY" -c "import torch" 2>/dev/null; then
    torch_req=("${TORCH_SPEC:-torch==2.13.0}")
  fi
  # Installing is skipped when every package is there already (pip's check alone takes seconds).
  if [ ${#torch_req[@]} -gt 0 ] || ! "$VENV_PY" - setuptools wheel ninja "$@" <<'PY' 2>/dev/null
import importlib.metadata as m, sys
for name in sys.argv[1:]:
    m.version(name)
PY
  then
    echo "installing ${torch_req[*]} setuptools wheel ninja $* into $dir"
    "$VENV_PY" -m pip install -q --disable-pip-version-check "${torch_req[@]}" setuptools wheel ninja "$@"
  fi
}

# What the build depends on: the interpreter and its torch, the settings setup.py reads, the
# sources and build files.
_build_stamp() {
  {
    "$VENV_PY" -c 'import importlib.metadata as m, sys; print(sys.executable, m.version("torch"))'
    env | grep -E '^(DSV4_OPS_[A-Z_]+|TORCH_CUDA_ARCH_LIST|PYTORCH_ROCM_ARCH|CUDA_HOME|ROCM_HOME|CC|CXX|CUDAHOSTCXX)=' | sort
    find csrc setup.py pyproject.toml -type f -print0 | sort -z | xargs -0 sha256sum
  } | sha256sum | cut -d' ' -f1
}

# Whether $VENV_PY has dsv4_ops installed in editable mode from this folder.
_installed_editable_here() {
  "$VENV_PY" - "$PWD" <<'PY' 2>/dev/null
import importlib.metadata as m, json, os, sys
url = json.loads(m.distribution("dsv4_ops").read_text("direct_url.json") or "{}")
here = os.path.realpath(sys.argv[1])
ok = url.get("dir_info", {}).get("editable") and os.path.realpath(url.get("url", "")[7:]) == here
sys.exit(0 if ok else 1)
PY
}

build_inplace() {
  local stamp stamp_file=build/dsv4_ops_build.stamp log=build/dsv4_ops_build.log
  stamp=$(_build_stamp)
  if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ] &&
     compgen -G "dsv4_ops/_C*.so" >/dev/null && [ -f dsv4_ops/_build_info.json ] &&
     _installed_editable_here; then
    return 0
  fi
  local jobs=${MAX_JOBS:-2} t0=$SECONDS
  if [ -f build/editable/build.ninja ]; then
    echo "rebuilding the dsv4_ops extension (only what changed; MAX_JOBS=$jobs, log: $log)..."
  else
    echo "building the dsv4_ops extension (first time: about a minute on 2 cores; MAX_JOBS=$jobs, log: $log)..."
  fi
  mkdir -p build
  rm -f "$stamp_file"
  if ! DSV4_OPS_BUILD_TEMP=build/editable MAX_JOBS=$jobs "$VENV_PY" -m pip install \
       --disable-pip-version-check --no-build-isolation --no-deps -e . > "$log" 2>&1; then
    tail -n 40 "$log"
    echo "building the dsv4_ops extension failed (the whole log: $log)" >&2
    return 1
  fi
  echo "built the dsv4_ops extension in $((SECONDS - t0)) s"
  echo "$stamp" > "$stamp_file"
}
