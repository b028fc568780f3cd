#!/usr/bin/env bash
# The C++ suites under sanitizers, each in a build directory of its own (GCC, no torch):
#   build-asan/  every core suite (common, transports, collectives, codec) with ASan + UBSan
#                (leaks included; any report fails its test),
#   build-tsan/  the transport and collective suites with TSan (data races, lock order).
# Usage: scripts/sanitize.sh [asan|tsan]...   (default: both). Last line:
# "sanitize.sh: N passed, N failed, N skipped" (tests, all builds together).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
JOBS="${NANOCCL_BUILD_JOBS:-2}"
TEST_TIMEOUT="${NANOCCL_TEST_TIMEOUT:-600}"
KINDS=("$@")
((${#KINDS[@]} == 0)) && KINDS=(asan tsan)

# The transport and collective suites TSan runs (its build is slow and its runs 5-15x slower):
# these binaries, each run whole, the longest first (2026-11-29: 156, 144, 60, 52, 11, 1.4 and
# 0.5 s).
TSAN_TARGETS=(nanoccl_transports_test nanoccl_collectives_test
              nanoccl_collectives_device_test nanoccl_collectives_hier_test
              nanoccl_collectives_fault_test nanoccl_shm_test nanoccl_routed_test)
# Where only part of a binary runs under TSan: the hierarchical suite's pipeline (its helper
# thread), lifecycle and faults; its every-collective shapes (minutes under TSan, and no thread
# the pipeline's tests do not have) run under ASan.
declare -A TSAN_FILTER=(
  [nanoccl_collectives_hier_test]='*HierarchicalPipeline.*:HierarchicalLifecycle.*:*HierarchicalFaults.*:HierarchicalMismatch.*'
)

# Runs one gtest binary whole (the tests `$3` selects, all without it): its output in `$2`, its
# exit status in `$2.rc`.
run_binary() {
  local bin="$1" log="$2" filter="${3:-*}"
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 timeout "$TEST_TIMEOUT" \
    "$bin" --gtest_brief=1 "--gtest_filter=$filter" >"$log" 2>&1
  echo $? >"$log.rc"
}

# Adds the counts of the run whose output is `$2` to passed/failed/skipped; 1 if it failed.
count_binary() {
  local name="$1" log="$2" brc n
  brc=$(cat "$log.rc" 2>/dev/null || echo 1)
  n=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -n 1)
  passed=$((passed + ${n:-0}))
  n=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | tail -n 1)
  skipped=$((skipped + ${n:-0}))
  n=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | tail -n 1)
  if ((brc != 0)); then
    failed=$((failed + ${n:-1}))
    echo "sanitize.sh: $name FAILED (exit $brc; log: $log):"
    grep -E 'WARNING: ThreadSanitizer|SUMMARY|\[  FAILED  \]' "$log" | head -n 10
    return 1
  fi
}

passed=0 failed=0 skipped=0 rc=0
for kind in "${KINDS[@]}"; do
  dir="build-$kind"
  case "$kind" in
    asan) flags="-fsanitize=address,undefined -fno-sanitize-recover=all"; targets=(all) ;;
    tsan) flags="-fsanitize=thread"; targets=("${TSAN_TARGETS[@]}") ;;
    *) echo "sanitize.sh: unknown kind '$kind' (asan|tsan)"; exit 2 ;;
  esac
  log="$dir/sanitize.log"
  mkdir -p "$dir"
  echo "sanitize.sh: $kind: building (${targets[*]}) in $dir"
  # -O1 -g1 (line tables): half the compile time of RelWithDebInfo's -O2 -g (measured: two test
  # binaries under ASan from scratch, 84 s against 179 s), the same test run time, and reports
  # still name file and line.
  if ! { cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
           "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
           -DNANOCCL_WITH_TORCH=OFF -DNANOCCL_WITH_CUDA=OFF -DNANOCCL_BUILD_BENCH=OFF \
           "-DCMAKE_CXX_FLAGS=$flags -fno-omit-frame-pointer" \
           "-DCMAKE_EXE_LINKER_FLAGS=${flags%% *}" &&
         ninja -C "$dir" -j "$JOBS" "${targets[@]}"; } >"$log" 2>&1; then
    echo "sanitize.sh: $kind build failed (log: $log); last lines:"
    tail -n 20 "$log"
    failed=$((failed + 1)) rc=1
    continue
  fi
  echo "sanitize.sh: $kind: running"
  before=$((passed + failed + skipped)) before_failed=$failed
  if [[ $kind == tsan ]]; then
    # Two binaries at a time (one per core, as ctest -j2 runs ASan's), longest first.
    for t in "${targets[@]}"; do
      while (($(jobs -rp | wc -l) >= 2)); do wait -n; done
      run_binary "$(find "$dir/tests" -name "$t" -type f -executable | head -n 1)" \
        "$dir/$t.log" "${TSAN_FILTER[$t]:-*}" &
    done
    wait
    for t in "${targets[@]}"; do
      count_binary "$t" "$dir/$t.log" || rc=1
    done
  else
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
      UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      ctest --test-dir "$dir" --output-on-failure -j 2 --timeout "$TEST_TIMEOUT" \
      >"$dir/ctest.log" 2>&1
    krc=$?
    total=$(sed -n 's/.* tests failed out of \([0-9]*\).*/\1/p' "$dir/ctest.log" | tail -n 1)
    kfailed=$(sed -n 's/.*tests passed, \([0-9]*\) tests\{0,1\} failed out of.*/\1/p' \
      "$dir/ctest.log" | tail -n 1)
    kskipped=$(grep -c '(Skipped)$' "$dir/ctest.log")
    total=${total:-0} kfailed=${kfailed:-$((krc != 0 ? 1 : 0))}
    kpassed=$((total - kfailed - kskipped))
    ((kpassed < 0)) && kpassed=0
    passed=$((passed + kpassed)) failed=$((failed + kfailed)) skipped=$((skipped + kskipped))
    if ((krc != 0)); then
      rc=1
      grep -E '\*\*\*Failed|Timeout|ERROR: (Address|Leak)Sanitizer|runtime error' \
        "$dir/ctest.log" | head -n 20
    fi
  fi
  echo "sanitize.sh: $kind: $((passed + failed + skipped - before)) tests," \
    "$((failed - before_failed)) failed (logs in $dir/)"
done
echo "sanitize.sh: $passed passed, $failed failed, $skipped skipped"
exit $rc
