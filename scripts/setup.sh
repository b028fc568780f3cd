#!/usr/bin/env bash
# Makes this checkout ready to build, test and run nanoccl on a Debian 12 machine (as root, or
# with sudo for the first step):
#   1. Debian packages: apt-get only when one is missing (and `apt-get update` only then),
#   2. the virtual environment .venv: torch==2.13.0 (the CPU wheel) first, then the Python
#      tools, all under scripts/constraints.txt so nothing can replace that torch,
#   3. where a CUDA compiler is present (as CMake finds it: $CUDACXX, /usr/local/cuda/bin/nvcc
#      or nvcc on PATH), NCCL's headers and library for the CUDA build: the nvidia-nccl-cu13
#      wheel in .venv (cmake/FindNCCL.cmake finds it there),
#   4. the CMake build in build/ (Ninja, Release, torch backend on, -j2),
#   5. the `nanoccl` Python package, importable from .venv.
# Idempotent: a second run only checks, and the build step is ninja's "no work to do".
# Prints one line per step; the commands' own output goes to build/setup.log.
set -Eeuo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BUILD_DIR=build
VENV=.venv
PY="$ROOT/$VENV/bin/python"
TORCH_PIN="torch==2.13.0"
NCCL_PIN="nvidia-nccl-cu13==2.30.7"
CONSTRAINTS="$ROOT/scripts/constraints.txt"
JOBS="${NANOCCL_BUILD_JOBS:-2}"

# Debian packages the build, the tests and the emulated cluster need.
APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config    # compilers and the build
  python3 python3-venv python3-dev                # .venv, and Python.h for the torch module
  liburing-dev libfabric-dev                      # TCP engine on io_uring, libfabric transport
  libgtest-dev libgmock-dev libbenchmark-dev      # C++ tests and microbenchmarks
  iproute2 tcpdump                                # ip netns / tc for the emulated cluster; captures
  libssl-dev                                      # libcrypto: HMAC and AES-GCM
  clang libclang-rt-14-dev                        # libFuzzer targets (scripts/fuzz.sh)
)
# Python packages besides torch (tests, plots, building the extension module; torchft for the
# test of its DiLoCo over nanoccl, examples/torchft_diloco.py). Versions: scripts/constraints.txt.
PY_PACKAGES=(numpy pytest pytest-timeout matplotlib pybind11 scikit-build-core ninja torchft)

mkdir -p "$BUILD_DIR"
LOG="$ROOT/$BUILD_DIR/setup.log"
echo "=== setup.sh $(date -u +%FT%TZ)" >>"$LOG"
STEP="start"
START=$(date +%s)

say() { echo "setup: $*"; echo "setup: $*" >>"$LOG"; }

on_error() {
  echo "setup: FAILED during: $STEP (full output: $LOG); last lines:" >&2
  tail -n 25 "$LOG" >&2 || true
}
trap on_error ERR

# Runs a command with its output in the log.
logged() { echo "+ $*" >>"$LOG"; "$@" >>"$LOG" 2>&1; }

install_apt_packages() {
  STEP="Debian packages"
  local missing=() p
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    say "apt: all ${#APT_PACKAGES[@]} packages present"
    return
  fi
  local sudo=()
  if ((EUID != 0)); then
    if command -v sudo >/dev/null; then
      sudo=(sudo -n)
    else
      echo "setup: missing Debian packages (${missing[*]}) and not root: run as root" >&2
      exit 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  logged "${sudo[@]}" apt-get update -q
  logged "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
  say "apt: installed ${missing[*]}"
}

# Whether .venv has the pinned torch and every other package (no pip run, so it is fast).
venv_satisfied() {
  "$PY" - "$TORCH_PIN" "${PY_PACKAGES[@]}" <<'PYEOF' >>"$LOG" 2>&1
import sys
from importlib import metadata

pin, *names = sys.argv[1:]
want = pin.split("==")[1]
try:
    have = metadata.version("torch")
except metadata.PackageNotFoundError:
    sys.exit("torch missing")
if have.split("+")[0] != want:
    sys.exit(f"torch {have} is not {want}")
for name in names:
    try:
        metadata.version(name)
    except metadata.PackageNotFoundError:
        sys.exit(f"{name} missing")
PYEOF
}

setup_venv() {
  STEP="virtual environment"
  local created=""
  if [[ ! -x "$PY" ]]; then
    if [[ -e "$VENV" ]]; then
      echo "setup: $VENV exists but has no bin/python; move it away and run again" >&2
      exit 1
    fi
    logged python3 -m venv "$VENV"
    created="created, "
  fi
  if venv_satisfied; then
    say "venv: $VENV ${created}up to date (torch $("$PY" -c 'from importlib import metadata as m; print(m.version("torch"))'))"
    return
  fi
  local pip=("$PY" -m pip install --no-input --disable-pip-version-check --progress-bar off
             -c "$CONSTRAINTS")
  # torch first, pinned: the CPU wheel comes from the machine's pip configuration.
  logged "${pip[@]}" "$TORCH_PIN"
  logged "${pip[@]}" "${PY_PACKAGES[@]}"
  venv_satisfied || { echo "setup: .venv still incomplete after pip install" >&2; false; }
  say "venv: $VENV ${created}installed torch $("$PY" -c 'from importlib import metadata as m; print(m.version("torch"))') + ${PY_PACKAGES[*]}"
}

# Whether CMake will find a CUDA compiler (the same places as the top-level CMakeLists.txt).
have_nvcc() {
  [[ -n "${CUDACXX:-}" && -x "${CUDACXX}" ]] || [[ -x /usr/local/cuda/bin/nvcc ]] ||
    command -v nvcc >/dev/null
}

# NCCL for the CUDA build (nccl.h, libnccl.so.2), only where there is a CUDA compiler: without
# one the build is CPU-only and needs no NCCL.
install_nccl() {
  STEP="NCCL"
  if ! have_nvcc; then
    say "nccl: no CUDA compiler, skipped (CPU-only build)"
    return
  fi
  local want="${NCCL_PIN#*==}" have
  have="$("$PY" -c 'from importlib import metadata as m; print(m.version("nvidia-nccl-cu13"))' \
    2>/dev/null || true)"
  if [[ "$have" == "$want" ]]; then
    say "nccl: nvidia-nccl-cu13 $have present in $VENV"
    return
  fi
  # Not fatal: without NCCL, CMake's NANOCCL_WITH_CUDA=AUTO builds CPU-only.
  if ! logged "$PY" -m pip install --no-input --disable-pip-version-check --progress-bar off \
    -c "$CONSTRAINTS" "$NCCL_PIN"; then
    say "nccl: could not install $NCCL_PIN (see $LOG): the build will be CPU-only"
    return
  fi
  say "nccl: installed $NCCL_PIN in $VENV (headers and libnccl.so.2 for the CUDA build)"
}

# Whether build/ was configured for this checkout's .venv with Ninja.
configured() {
  local cache="$BUILD_DIR/CMakeCache.txt"
  [[ -f "$cache" && -f "$BUILD_DIR/build.ninja" ]] &&
    grep -qx "CMAKE_GENERATOR:INTERNAL=Ninja" "$cache" &&
    grep -q "^Python_EXECUTABLE:[A-Z]*=$PY\$" "$cache"
}

build() {
  STEP="CMake configure"
  local what=""
  if ! configured; then
    local prefix
    prefix="$("$PY" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)');$("$PY" -m pybind11 --cmakedir)"
    logged cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DPython_EXECUTABLE="$PY" -DCMAKE_PREFIX_PATH="$prefix" -DNANOCCL_WITH_TORCH=ON
    what="configured, "
  fi
  STEP="build"
  local out
  out="$(cmake --build "$BUILD_DIR" -j "$JOBS" 2>&1)" || {
    echo "$out" >>"$LOG"
    false
  }
  echo "$out" >>"$LOG"
  if grep -q "ninja: no work to do" <<<"$out"; then
    say "build: $BUILD_DIR/ ${what}up to date (ninja: no work to do)"
  else
    say "build: $BUILD_DIR/ ${what}built ($(grep -c '^\[[0-9]*/[0-9]*\]' <<<"$out") steps, -j$JOBS)"
  fi
}

# The nanoccl package in .venv. Agreed path: the CMake build above makes the extension module
# inside build/, and an editable install makes the package importable. Kept in this one function
# so the backend's packaging can change it in one place.
# The editable install carries its own copy of the compiled module (pyproject.toml's build-dir),
# so it is redone whenever the module in build/ changed: otherwise Python would import a stale
# one after a C++ change.
install_python_package() {
  STEP="Python package"
  if [[ ! -f pyproject.toml ]]; then
    say "python package: no pyproject.toml yet, skipped"
    return
  fi
  local stamp="$BUILD_DIR/.python-package.stamp" want module
  want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
  for module in "$BUILD_DIR"/torch_ext/_C*.so; do
    [[ -f "$module" ]] && want+=" $(sha256sum "$module" | cut -d' ' -f1)"
  done
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] &&
     "$PY" -c 'from importlib import metadata; metadata.distribution("nanoccl")' 2>/dev/null; then
    say "python package: nanoccl already installed in $VENV (editable)"
    return
  fi
  logged env CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" "$PY" -m pip install --no-input \
    --disable-pip-version-check --no-build-isolation --no-deps -c "$CONSTRAINTS" -e .
  echo "$want" >"$stamp"
  say "python package: nanoccl installed in $VENV (editable)"
}

install_apt_packages
setup_venv
install_nccl
build
install_python_package
STEP="done"
say "ready in $(($(date +%s) - START)) s"
