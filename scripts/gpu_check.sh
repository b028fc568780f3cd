#!/usr/bin/env bash
# The GPU check, as one command (docs/development.md, "The GPU check"): on a machine with a GPU,
# torch with CUDA and NCCL, builds only what the CUDA tests and nanoccl-perf need (16 jobs),
# runs every CUDA test (the CUDA device's C++ suite with NCCL as its node stage, the CUDA codec
# kernels, torch's CUDA collectives through the backend), the host-device suite, then a short
# `nanoccl-perf --ab nccl` on an emulated 2x2 cluster sharing the one GPU (network namespaces and
# tc tbf at 1 Gbit/s where the machine allows them, else loopback: the summary says which), and
# writes results/gpu/ (summary.md, perf.txt/perf.json, the logs, the test XML). Sized for under
# 8 minutes there. On a machine without a GPU it builds and runs the host-device suite and the
# same perf launch on CPU tensors against Gloo, says that no GPU is present and exits 0 when
# those pass.
#
#   bash scripts/gpu_check.sh                  # results in results/gpu/ (OUT=... elsewhere)
#
# Without a package registry: `bash scripts/gpu_bundle.sh` here first, and carry .gpu-bundle/
# along; what the machine lacks (cmake, ninja, GoogleTest, OpenSSL headers) comes from there.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/results/gpu}"
BUILD="${GPU_BUILD_DIR:-$ROOT/build-gpu}"
JOBS="${NANOCCL_BUILD_JOBS:-16}"
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; else PY="$(command -v python3)"; fi
fi
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
: >"$LOG"
SUMMARY="$OUT/summary.md"
START=$(date +%s)
FAILED=0

say() { echo "gpu_check: $*"; echo "gpu_check: $*" >>"$LOG"; }
# step NAME LIMIT_S CMD...: runs CMD with a time limit, output in the log; records the outcome.
declare -a ROWS=()
step() {
  local name="$1" limit="$2"
  shift 2
  local t0=$SECONDS rc=0
  echo "=== $name: $*" >>"$LOG"
  timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1 || rc=$?
  local took=$((SECONDS - t0))
  local verdict="ok"
  if ((rc == 124 || rc == 137)); then verdict="TIMED OUT after ${limit}s"; elif ((rc != 0)); then verdict="FAILED (rc $rc)"; fi
  [[ "$verdict" == ok ]] || FAILED=1
  ROWS+=("| $name | $verdict | ${took}s |")
  say "$name: $verdict (${took}s)"
  return $rc
}

gpus="$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>>"$LOG" || echo 0)"
say "python $PY, torch $("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null || echo none), GPUs: $gpus"

# ---- what the build needs: from .gpu-bundle/ where the machine lacks it -----------------------
BUNDLE="$ROOT/.gpu-bundle"
if ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
  if [[ -d "$BUNDLE/wheels" ]]; then
    step "build tools from .gpu-bundle" 120 "$PY" -m pip install -q --no-index --find-links "$BUNDLE/wheels" cmake ninja
    export PATH="$(dirname "$PY"):$HOME/.local/bin:$PATH"
  else
    say "no cmake/ninja and no .gpu-bundle/ (bash scripts/gpu_bundle.sh on a machine with a registry)"
  fi
fi
if [[ ! -e /usr/include/gtest/gtest.h || ! -e /usr/include/openssl/hmac.h ]] && compgen -G "$BUNDLE/debs/*.deb" >/dev/null; then
  step "libraries from .gpu-bundle" 120 dpkg -i "$BUNDLE"/debs/*.deb
fi

# ---- build: the CUDA tests, the host-device suite and the torch module ------------------------
prefix="$("$PY" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)' 2>/dev/null)"
cuda=OFF
((gpus > 0)) && cuda=ON
step "configure (CUDA $cuda)" 120 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$PY" -DCMAKE_PREFIX_PATH="$prefix" -DNANOCCL_WITH_CUDA="$cuda" \
  -DNANOCCL_BUILD_BENCH=OFF -DNANOCCL_WITH_TORCH=AUTO
targets=(nanoccl_collectives_device_test)
if ((gpus > 0)); then
  targets+=(nanoccl_cuda_device_test nanoccl_codec_cuda_test nanoccl_python)
fi
step "build ${targets[*]}" 300 cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"

# ---- tests ------------------------------------------------------------------------------------
gtest() {  # gtest NAME BINARY LIMIT
  local bin
  bin="$(find "$BUILD" -name "$2" -type f -perm -u+x | head -n 1)"
  if [[ -z "$bin" ]]; then ROWS+=("| $1 | NOT BUILT | |"); FAILED=1; return; fi
  step "$1" "$3" "$bin" --gtest_brief=1 --gtest_output="xml:$OUT/$2.xml"
}
gtest "host-device suite (ctest -R Device)" nanoccl_collectives_device_test 180
# ---- nanoccl-perf --ab nccl: an emulated 2x2 cluster on the one GPU --------------------------
# Two nodes of two ranks (bench/emucluster.py): network namespaces joined by tc-shaped 1 Gbit/s
# links where this machine allows them (root, ip netns, tc tbf), else the same launch on
# loopback with a node id per node (the summary says which). All four ranks share the one GPU:
# each rank is its own NCCL host (NCCL_HOSTID), since stock NCCL refuses two ranks of one host on
# one GPU, so nanoccl's node stage (NCCL between the two ranks of a node) and stock NCCL's
# every leg go over NCCL's sockets.
cat >"$BUILD/perf_rank.py" <<'EOF_RANK'
import os, runpy, sys
os.environ["NCCL_HOSTID"] = "gpucheck-rank" + os.environ.get("RANK", "0")
os.environ.setdefault("NCCL_SOCKET_IFNAME", os.environ.get("NANOCCL_SOCKET_IFNAME", "lo").split(",")[0])
sys.argv[0] = "nanoccl-perf"
runpy.run_module("nanoccl.perf", run_name="__main__", alter_sys=True)
EOF_RANK
shaping=(--rate 1gbit)
link="2 nodes in network namespaces, tc tbf at 1 Gbit/s"
probe="gpucheck$$"
if ! { ip netns add "$probe" && ip netns exec "$probe" tc qdisc add dev lo root tbf rate 1gbit burst 64kb latency 50ms; } >>"$LOG" 2>&1; then
  shaping=(--no-shaping)
  link="loopback, unshaped (no network namespaces or tc tbf here): 2 nodes by node id only"
fi
ip netns del "$probe" >/dev/null 2>&1 || true
say "nanoccl-perf link: $link"
emu_perf() {  # emu_perf NAME LIMIT PERF_ARGS...
  local name="$1" limit="$2"
  shift 2
  step "$name" "$limit" "$PY" bench/emucluster.py --nodes 2 --procs-per-node 2 "${shaping[@]}" \
    --timeout "$((limit - 10))" -- "$BUILD/perf_rank.py" "$@"
}
if ((gpus == 0)); then
  # The perf launch itself on CPU tensors (nanoccl against Gloo): the wrapper, the emulated
  # cluster and the A/B work here, so that the GPU's minutes go to the GPU.
  if "$PY" -c 'import nanoccl' 2>>"$LOG"; then
    emu_perf "perf launch on CPU tensors (2x2, --ab gloo)" 240 -c allreduce -b 1M -e 4M -f 4 \
      -n 5 -w 2 --ab gloo --device cpu
  else
    ROWS+=("| perf launch on CPU tensors | NOT RUN (import nanoccl failed: scripts/setup.sh first) | |")
  fi
  say "no GPU present: the CUDA tests, the torch CUDA collectives and the perf A/B need one"
  {
    echo "# GPU check: no GPU present"
    echo
    echo "$(date -u +%F) on $(hostname): torch.cuda.device_count() = 0. The host-device suite and the perf launch on CPU tensors ran; nothing needed a GPU. Link: $link."
    echo
    echo "| step | result | time |"; echo "|---|---|---|"
    printf '%s\n' "${ROWS[@]}"
  } >"$SUMMARY"
  exit $FAILED
fi
gtest "CUDA device (C++)" nanoccl_cuda_device_test 120
gtest "CUDA codec kernels (C++)" nanoccl_codec_cuda_test 60

# The torch module, next to the package's Python files, on PYTHONPATH.
PKG="$BUILD/pkg"
rm -rf "$PKG"
mkdir -p "$PKG"
cp -r torch_ext/nanoccl "$PKG/"
module="$(find "$BUILD" -name '_C*.so' -path '*torch_ext*' | head -n 1)"
[[ -n "$module" ]] && cp "$module" "$PKG/nanoccl/"
export PYTHONPATH="$PKG${PYTHONPATH:+:$PYTHONPATH}"
if "$PY" -c 'import pytest' 2>/dev/null; then
  step "torch CUDA collectives (tests/torch/test_cuda.py)" 180 "$PY" -m pytest -q -x tests/torch/test_cuda.py
else
  ROWS+=("| torch CUDA collectives | NOT RUN (no pytest here) | |")
fi

emu_perf "nanoccl-perf --ab nccl (2x2 emulated, 1 GPU)" 300 -c allreduce -b 1M -e 64M -f 4 -n 10 \
  -w 3 --ab nccl --device cuda -J "$OUT/perf.json"
grep -E '\] *(#|[0-9])' "$LOG" | tail -n 24 >"$OUT/perf.txt" || true

{
  echo "# GPU check"
  echo
  echo "$(date -u +%F) on $(hostname): $gpus GPU(s), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1); torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null). Command: \`bash scripts/gpu_check.sh\`, $(( $(date +%s) - START )) s."
  echo
  echo "| step | result | time |"; echo "|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
  echo
  echo "nanoccl-perf link: $link; stock NCCL sees four hosts (each rank its own NCCL_HOSTID), so its intra-node legs go over sockets too. Output: perf.txt, perf.json; every step's output: gpu_check.log; tests: *.xml."
} >"$SUMMARY"
say "summary in $SUMMARY"
exit $FAILED
