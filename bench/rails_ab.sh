#!/usr/bin/env bash
# Several NICs a node (docs/networking.md): nanoccl's allreduce on two rails of the
# emulated cluster against Gloo given both interfaces, int8 on two rails against int8 on one
# (2x2 and 2x1), and two unequal rails against the fast one alone, each A/B in one launch. Writes
# results/rails/<name>.txt (the perf tables) and .json. Needs root (namespaces, tc).
# Usage: bench/rails_ab.sh [-n ITERS]   (default 10; about 10 minutes in all on 2 cores)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
ITERS=10
if [[ "${1:-}" == "-n" ]]; then ITERS="$2"; fi
PY="$ROOT/.venv/bin/python"
OUT=results/rails
mkdir -p "$OUT"

run() {  # name, emucluster options..., --, perf options...
  local name="$1"; shift
  local emu=() perf=()
  while [[ "$1" != "--" ]]; do emu+=("$1"); shift; done
  shift
  perf=("$@")
  echo "rails_ab: $name" >&2
  # --mode barrier: every rank starts each timed call together. Without it, with more ranks
  # than cores, a rank's refill of its input before a call (outside its timer) runs into the
  # other ranks' timed calls, on both sides alike, pulling every ratio towards 1.
  "$PY" bench/emucluster.py "${emu[@]}" -- torch_ext/nanoccl/perf.py -c allreduce \
    -w 1 -n "$ITERS" --mode barrier --json "$OUT/$name.json" "${perf[@]}" 2>&1 |
    tee "$OUT/$name.txt"
}

# One rail only, for the reference sides: every rail's rate list would not fit one interface.
ONE_RAIL=(--ab nanoccl --ab-set socket_ifname=eth0 --ab-set rail_mbps=)
run 2x1_two_rails_vs_gloo --nodes 2 --procs-per-node 1 --rails 2 -- -b 16M -e 256M -f 4 --ab gloo
run 2x2_two_rails_vs_gloo --nodes 2 --procs-per-node 2 --rails 2 -- -b 16M -e 256M -f 4 --ab gloo
run 2x2_int8_two_rails_vs_one --nodes 2 --procs-per-node 2 --rails 2 -- -b 16M -e 256M -f 4 \
  --compression int8 "${ONE_RAIL[@]}" --ab-set compression=int8 --ab-set compression_min_bytes=0
# The same with one rank a node: a core a rank, so the codec does not share it with another.
run 2x1_int8_two_rails_vs_one --nodes 2 --procs-per-node 1 --rails 2 -- -b 16M -e 256M -f 4 \
  --compression int8 "${ONE_RAIL[@]}" --ab-set compression=int8 --ab-set compression_min_bytes=0
run 2x1_unequal_rails_vs_fast_one --nodes 2 --procs-per-node 1 --rails 2 \
  --rail-rates 1gbit,100mbit -- -b 16M -e 256M -f 4 "${ONE_RAIL[@]}"
