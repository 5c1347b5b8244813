#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs every test
# that does not need a GPU (unit tests, CPU-reference checks and the integration
# tests against a real flashq-server process) through one runner, ctest.
# Exits non-zero if anything fails.
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
scripts/build.sh
# Reconfigure once more if the venv appeared after the first configure (the
# integration tests are registered only when .venv/bin/python exists).
if [ -x .venv/bin/python ] && ! grep -q '^FLASHQ_INTEGRATION_TESTS:INTERNAL=ON' "$BUILD_DIR/CMakeCache.txt" 2>/dev/null; then
  cmake "$BUILD_DIR" >/dev/null
fi

echo "test: ctest --output-on-failure -LE gpu $*"
rc=0
( cd "$BUILD_DIR" && ctest --output-on-failure -LE gpu -j"${FLASHQ_TEST_JOBS:-$(nproc)}" "$@" ) || rc=$?
echo "test: $( [ $rc = 0 ] && echo PASSED || echo "FAILED (ctest exit $rc)" ) in $(( $(date +%s) - start ))s"
exit $rc
