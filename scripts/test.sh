#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs every test
# that does not need a GPU (unit tests, CPU-reference checks and the integration
# tests against a real flashq-server process) through one runner, ctest.
# Exits non-zero if anything fails, or if no test ran (a filter that matches nothing
# or only tests that skip).
#
#   scripts/test.sh                      # everything except label `gpu`
#   scripts/test.sh -L integration       # extra arguments go to ctest
#   BUILD_DIR=build-ci FLASHQ_CUDA_ARCHS=90a-real scripts/test.sh
#   FLASHQ_TEST_JOBS=1 ...               # ctest parallelism (default: number of cores)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
BUILD_DIR="${BUILD_DIR:-build}"
start=$(date +%s)

scripts/setup.sh
# The newest tritonclient, in a second venv, for integration.tritonclient_latest.
scripts/setup-tritonclient-latest.sh
scripts/build.sh
# Reconfigure once more if a venv appeared after the first configure (the integration
# tests are registered only when .venv/bin/python, and .venv-tritonclient-latest/bin/python
# for integration.tritonclient_latest, exist).
if { [ -x .venv/bin/python ] && ! grep -q '^FLASHQ_INTEGRATION_TESTS:INTERNAL=ON' "$BUILD_DIR/CMakeCache.txt"; } ||
   { [ -x .venv-tritonclient-latest/bin/python ] &&
     ! grep -q '^FLASHQ_TRITONCLIENT_LATEST_TEST:INTERNAL=ON' "$BUILD_DIR/CMakeCache.txt"; } 2>/dev/null; then
  cmake "$BUILD_DIR" >/dev/null
fi

echo "test: ctest --output-on-failure --no-tests=error -LE gpu $*"
# A filter that selects nothing, or only tests that skip, ran nothing: that is not a pass
# (ctest itself exits 0 when it finds no tests, hence --no-tests=error).
log="$BUILD_DIR/Testing/test-sh.log"
mkdir -p "$(dirname "$log")"
set +e
( cd "$BUILD_DIR" && ctest --output-on-failure --no-tests=error -LE gpu -j"${FLASHQ_TEST_JOBS:-$(nproc)}" "$@" ) 2>&1 |
  tee "$log"
rc=${PIPESTATUS[0]}
set -e
total=$(sed -n 's/.*tests passed, [0-9]* tests\{0,1\} failed out of \([0-9]*\).*/\1/p' "$log" | tail -n 1)
skipped=$(grep -c '\*\*\*Skipped\| Not Run ' "$log" || true)
if [ "$rc" = 0 ] && { [ -z "$total" ] || [ "$total" -le "$skipped" ]; }; then
  echo "test: no test ran (${total:-0} selected, $skipped skipped)"
  rc=1
fi
echo "test: $( [ $rc = 0 ] && echo PASSED || echo "FAILED (exit $rc)" ) in $(( $(date +%s) - start ))s"
exit $rc
