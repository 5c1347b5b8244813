#!/usr/bin/env bash
# Self-test of the fuzz gate: with FLASHQ_FUZZ_PLANTED_CRASH set, the harness aborts on
# the one seed in fuzz/selftest, and fuzz/run.sh must then fail: exit non-zero, not 77
# (which ctest reads as skipped), with the crash input saved as an artifact. Passes only
# then. Exit 77 here only when the fuzzer is not built (the gate itself skips then too).
#
#   tests/reliability/fuzz_gate_selftest.sh FUZZER ARTIFACTS_DIR
set -uo pipefail
FUZZER="$1"
ARTIFACTS="$2"
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
if [ ! -x "$FUZZER" ]; then echo "fuzz_gate_selftest: $FUZZER not built: skipping"; exit 77; fi
rm -rf "$ARTIFACTS"
FLASHQ_FUZZ_PLANTED_CRASH=1 FLASHQ_FUZZ_SEEDS="$SRC/fuzz/selftest" "$SRC/fuzz/run.sh" "$FUZZER" 20 "$ARTIFACTS"
rc=$?
echo "fuzz_gate_selftest: fuzz/run.sh exited $rc on the planted crash"
if [ "$rc" = 0 ] || [ "$rc" = 77 ]; then
  echo "fuzz_gate_selftest: FAILED: a crashing input must fail the gate (exit neither 0 nor 77)"; exit 1
fi
crash=$(ls "$ARTIFACTS"/crash-* 2>/dev/null | head -n 1)
if [ -z "$crash" ]; then
  echo "fuzz_gate_selftest: FAILED: no crash-* reproducer in $ARTIFACTS"; exit 1
fi
if ! cmp -s "$crash" "$(ls "$SRC"/fuzz/selftest/* | head -n 1)"; then
  echo "fuzz_gate_selftest: FAILED: the reproducer $crash is not the planted input"; exit 1
fi
echo "fuzz_gate_selftest: passed: the planted crash failed the gate (exit $rc) and was saved as $crash"
