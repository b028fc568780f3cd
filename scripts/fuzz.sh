#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/) with clang, ASan and UBSan in build-fuzz/, and runs
# each for NANOCCL_FUZZ_SECONDS (default 20) over a copy of its seed corpus
# (tests/fuzz/corpus/<target>/). A crash, a sanitizer report or a broken promise (each target
# traps on one) fails the run and leaves the input under build-fuzz/crashes/; add it to the
# corpus with a fix. Without clang it says so and exits 0 with "skipped".
# Last line: "fuzz.sh: N passed, N failed, N skipped".
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
BUILD_DIR=build-fuzz
SECONDS_EACH="${NANOCCL_FUZZ_SECONDS:-20}"
TARGETS=(fuzz_frame_header fuzz_record fuzz_settings fuzz_handshake)
LOG="$BUILD_DIR/fuzz.log"

if ! command -v clang++ >/dev/null; then
  echo "fuzz.sh: clang++ not found (apt-get install clang libclang-rt-14-dev): fuzzing skipped"
  echo "fuzz.sh: 0 passed, 0 failed, ${#TARGETS[@]} skipped"
  exit 0
fi
mkdir -p "$BUILD_DIR"
echo "=== fuzz.sh $(date -u +%FT%TZ)" >"$LOG"
if ! { cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
         -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DNANOCCL_BUILD_FUZZ=ON \
         -DNANOCCL_WITH_TORCH=OFF -DNANOCCL_WITH_CUDA=OFF -DNANOCCL_BUILD_TESTS=OFF \
         -DNANOCCL_BUILD_BENCH=OFF &&
       ninja -C "$BUILD_DIR" -j "${NANOCCL_BUILD_JOBS:-2}" "${TARGETS[@]}"; } >>"$LOG" 2>&1; then
  echo "fuzz.sh: the fuzz build failed (log: $LOG); last lines:"
  tail -n 20 "$LOG"
  echo "fuzz.sh: 0 passed, ${#TARGETS[@]} failed, 0 skipped"
  exit 1
fi

passed=0 failed=0
mkdir -p "$BUILD_DIR/crashes"
for t in "${TARGETS[@]}"; do
  work="$BUILD_DIR/corpus/$t"
  rm -rf "$work" && mkdir -p "$work" && cp tests/fuzz/corpus/"$t"/* "$work"/
  out="$BUILD_DIR/$t.log"
  NANOCCL_DEBUG=NONE "$BUILD_DIR/tests/fuzz/$t" -max_total_time="$SECONDS_EACH" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$BUILD_DIR/crashes/$t-" \
    "$work" >"$out" 2>&1
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out" | tail -n 1)
  if ((rc == 0)); then
    passed=$((passed + 1))
    echo "fuzz.sh: $t: ${runs:-?} inputs in ${SECONDS_EACH} s, no failure"
  else
    failed=$((failed + 1))
    echo "fuzz.sh: $t FAILED (exit $rc; input in $BUILD_DIR/crashes/, log $out):"
    grep -E "ERROR|SUMMARY|runtime error|deadly signal" "$out" | head -n 10
  fi
  cat "$out" >>"$LOG"
done
echo "fuzz.sh: $passed passed, $failed failed, 0 skipped"
((failed == 0))
