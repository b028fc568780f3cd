#!/usr/bin/env bash
# The main job: nanoccl against Gloo on an emulated 2-node cluster (network namespaces joined
# by links shaped to 1 Gbit/s): nanoccl-perf allreduce --ab gloo and a short DDP training with
# each backend, printed as tables and written as a PNG plot. Runs scripts/setup.sh first.
# Arguments are passed on to bench/ab_main.py (see its --help).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

scripts/setup.sh

MAIN=bench/ab_main.py
if [[ ! -f "$MAIN" ]]; then
  echo "ab.sh: $MAIN (the A/B main job) does not exist yet; nothing to run" >&2
  exit 2
fi
if ((EUID != 0)); then
  echo "ab.sh: note: the emulated cluster needs root (ip netns, tc); without it the job" \
    "offers the unshaped loopback run" >&2
fi
exec "$ROOT/.venv/bin/python" "$MAIN" "$@"
