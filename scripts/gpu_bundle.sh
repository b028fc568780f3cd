#!/usr/bin/env bash
# Fetches here what scripts/gpu_check.sh needs to build on a GPU machine that has torch, CUDA
# and NCCL but no package registry: Python wheels of the build tools (cmake, ninja) and the
# Debian packages of the libraries the build links (GoogleTest, OpenSSL headers, liburing),
# into .gpu-bundle/ (git-ignored; hand it to the device run with `carry`).
#
#   bash scripts/gpu_bundle.sh          # then: carry [".gpu-bundle", ...] on the device run
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="$ROOT/.gpu-bundle"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
mkdir -p "$OUT/wheels" "$OUT/debs"

# Build tools as manylinux wheels: they install on any glibc Linux, whatever its distribution.
"$PY" -m pip download -q --only-binary=:all: --dest "$OUT/wheels" \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --python-version "$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')" \
  cmake ninja

# Libraries (headers and link files) as Debian packages, installed there only where missing.
(
  cd "$OUT/debs"
  apt-get download googletest libgtest-dev libssl-dev liburing-dev liburing2 2>&1 | tail -n 3
)
du -sh "$OUT" | sed 's/^/gpu_bundle: /'
ls "$OUT/wheels" "$OUT/debs" | sed 's/^/gpu_bundle:   /'
