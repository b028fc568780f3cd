#!/usr/bin/env bash
# Runs every test of nanoccl: scripts/setup.sh (idempotent), then the C++ suites (GoogleTest,
# through ctest), the fuzz targets (scripts/fuzz.sh: libFuzzer, ASan + UBSan, a bounded time
# each), the C++ suites again under sanitizers (scripts/sanitize.sh) and the Python suites
# (pytest: tests/torch, tests/bench, tests/study). Exits non-zero if anything failed; the last
# line is the summary, "test.sh: N passed, N failed, N skipped".
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

BUILD_DIR=build
PY="$ROOT/.venv/bin/python"
TEST_TIMEOUT="${NANOCCL_TEST_TIMEOUT:-600}"  # seconds, per test (C++ and Python)
START=$(date +%s)

# Each part says when it starts, counted from START, so a log shows where the time went.
since() { echo "$(($(date +%s) - START)) s in"; }

if ! scripts/setup.sh; then
  echo "test.sh: setup failed, no test run"
  echo "test.sh: 0 passed, 1 failed"
  exit 1
fi

# ---- C++ ---------------------------------------------------------------------------------
echo "test.sh: ($(since)) C++ tests (ctest, -j2, ${TEST_TIMEOUT} s per test)"
CTEST_LOG="$BUILD_DIR/ctest.log"
# The full log goes to build/ctest.log; the console shows failures (with their output) and
# the summary, not one line per passing test.
ctest --test-dir "$BUILD_DIR" --output-on-failure -j 2 --timeout "$TEST_TIMEOUT" \
  --no-tests=error 2>&1 | tee "$CTEST_LOG" |
  grep -vE '^ +Start +[0-9]+: |^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* +Passed +[0-9.]+ sec$'
cpp_rc=${PIPESTATUS[0]}
cpp_total=$(sed -n 's/.* tests failed out of \([0-9]*\).*/\1/p' "$CTEST_LOG" | tail -n 1)
cpp_failed=$(sed -n 's/.*tests passed, \([0-9]*\) tests\{0,1\} failed out of.*/\1/p' "$CTEST_LOG" | tail -n 1)
cpp_skipped=$(grep -c '(Skipped)$' "$CTEST_LOG")
cpp_total=${cpp_total:-0}
cpp_skipped=${cpp_skipped:-0}
if [[ -z "$cpp_failed" ]]; then
  cpp_failed=$((cpp_rc != 0 ? 1 : 0))  # ctest stopped before its summary
fi
cpp_passed=$((cpp_total - cpp_failed - cpp_skipped))
((cpp_passed < 0)) && cpp_passed=0

# ---- Parts run by scripts of their own ------------------------------------------------------
# Runs `script`, teeing its output to build/<name>-summary.log, and sets <name>_rc, and
# <name>_passed / _failed / _skipped from its last "N passed, N failed, N skipped" line.
run_part() {
  local name="$1" script="$2" log="$BUILD_DIR/$1-summary.log" line rc kind n
  local failed="${name}_failed"
  "$script" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  line="$(grep -E '^[a-z]+\.sh: [0-9]+ passed' "$log" | tail -n 1)"
  for kind in passed failed skipped; do
    n=0
    [[ $line =~ ([0-9]+)\ $kind ]] && n="${BASH_REMATCH[1]}"
    printf -v "${name}_${kind}" '%s' "$n"
  done
  # A script that failed before it could count still counts as one failure.
  ((rc != 0 && ${!failed} == 0)) && printf -v "$failed" '%s' 1
  printf -v "${name}_rc" '%s' "$rc"
}

# libFuzzer targets (tests/fuzz/), ASan + UBSan, a bounded time each.
echo "test.sh: ($(since)) fuzz targets (scripts/fuzz.sh, ${NANOCCL_FUZZ_SECONDS:-20} s each)"
run_part fuzz scripts/fuzz.sh
# The core suites with ASan + UBSan, the transport and collective suites with TSan, each in a
# build directory of its own.
echo "test.sh: ($(since)) sanitizers (scripts/sanitize.sh: ASan+UBSan, TSan)"
run_part san scripts/sanitize.sh

# ---- Python ------------------------------------------------------------------------------
py_rc=0 py_passed=0 py_failed=0 py_skipped=0 py_note=""
PY_SUITES=(tests/torch tests/bench tests/study)
if compgen -G "tests/torch/test_*.py" >/dev/null || compgen -G "tests/bench/test_*.py" >/dev/null
then
  echo "test.sh: ($(since)) Python tests (pytest ${PY_SUITES[*]}, ${TEST_TIMEOUT} s per test)"
  PYTEST_LOG="$BUILD_DIR/pytest.log"
  # A broken `import nanoccl` fails the run (tests/torch/conftest.py); -rs prints every skip
  # with its reason (only what this machine lacks may skip).
  NANOCCL_TEST_REQUIRE_IMPORT=1 "$PY" -m pytest "${PY_SUITES[@]}" -q -rs -p no:cacheprovider \
    --timeout="$TEST_TIMEOUT" 2>&1 | tee "$PYTEST_LOG"
  py_rc=${PIPESTATUS[0]}
  summary="$(grep -E '[0-9]+ (passed|failed|skipped|error|errors|deselected)|no tests ran' \
    "$PYTEST_LOG" | tail -n 1)"
  count() { if [[ $summary =~ ([0-9]+)\ $1 ]]; then echo "${BASH_REMATCH[1]}"; else echo 0; fi; }
  py_passed=$(count passed)
  py_failed=$(($(count failed) + $(count error)))
  py_skipped=$(count skipped)
  if ((py_rc == 5)); then
    py_rc=0 py_note=" (no tests collected)"
  elif ((py_rc != 0 && py_failed == 0)); then
    py_failed=1  # pytest failed before running tests (collection or usage error)
  fi
else
  py_note=" (no Python tests yet)"
fi

elapsed=$(($(date +%s) - START))
status=PASS
((cpp_rc != 0 || fuzz_rc != 0 || san_rc != 0 || py_rc != 0)) && status=FAIL
echo "test.sh: $status in ${elapsed} s; C++: $cpp_passed passed, $cpp_failed failed," \
  "$cpp_skipped skipped; fuzz: $fuzz_passed passed, $fuzz_failed failed, $fuzz_skipped" \
  "skipped; sanitizers: $san_passed passed, $san_failed failed, $san_skipped skipped;" \
  "Python: $py_passed passed, $py_failed failed, $py_skipped skipped$py_note"
echo "test.sh: $((cpp_passed + fuzz_passed + san_passed + py_passed)) passed," \
  "$((cpp_failed + fuzz_failed + san_failed + py_failed)) failed," \
  "$((cpp_skipped + fuzz_skipped + san_skipped + py_skipped)) skipped"
[[ $status == PASS ]]
