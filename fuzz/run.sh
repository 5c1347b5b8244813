#!/usr/bin/env bash
# Runs the request fuzzer for a bounded time from the checked-in seed corpus and prints
# libFuzzer's final stats (executions, coverage, corpus).
#
#   fuzz/run.sh build-fuzz/bin/flashq_request_fuzzer 60 [ARTIFACTS] [extra libFuzzer flags]
#   FLASHQ_FUZZ_SEEDS=DIR ...   seeds from DIR instead of fuzz/corpus
#
# Exit status: 0 when the run found nothing; 77 (ctest: skipped) only when the fuzzer
# is not built; anything else is a failure (the reproducer is written to ARTIFACTS):
# 1 for an ASan/UBSan report (the sanitizers' exit code), 3 for a crash, abort or leak,
# 4 for a timeout, 71 for out-of-memory, or whatever else libFuzzer returned.
# libFuzzer's own default for crashes is 77, ctest's skip code, so it is set explicitly
# and a stray 77 from the fuzzer is turned into 1.
set -euo pipefail
FUZZER="$1"
SECONDS_TO_RUN="${2:-60}"
ARTIFACTS="${3:-$(dirname "$FUZZER")/fuzz-artifacts}"
shift $(( $# < 3 ? $# : 3 ))
HERE="$(cd "$(dirname "$0")" && pwd)"
SEEDS="${FLASHQ_FUZZ_SEEDS:-$HERE/corpus}"
if [ ! -x "$FUZZER" ]; then echo "fuzz: $FUZZER not built: skipping"; exit 77; fi
[ -n "$(ls -A "$SEEDS" 2>/dev/null)" ] || { echo "fuzz: no seeds in $SEEDS"; exit 1; }
mkdir -p "$ARTIFACTS"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/flashq-fuzz-corpus-XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
cp "$SEEDS"/* "$WORK"/
# Fuzzing the process's own threads: the harness waits for the scheduler's answer.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
echo "fuzz: $FUZZER for ${SECONDS_TO_RUN}s, corpus $WORK (seeds $(ls "$SEEDS" | wc -l) from $SEEDS), artifacts $ARTIFACTS"
start=$(date +%s)
set +e
"$FUZZER" -max_total_time="$SECONDS_TO_RUN" -dict="$HERE/request.dict" -max_len=65536 -timeout=30 \
  -rss_limit_mb=4096 -error_exitcode=3 -timeout_exitcode=4 -print_final_stats=1 \
  -artifact_prefix="$ARTIFACTS/" "$@" "$WORK" 2>&1 | grep -v -E '^#[0-9]+\s+(NEW|REDUCE|pulse)'
statuses=("${PIPESTATUS[@]}")
set -e
rc=${statuses[0]}
case "$rc" in
  0) verdict="nothing found" ;;
  1) verdict="FAILED: sanitizer report (or a libFuzzer usage error)" ;;
  3) verdict="FAILED: crash, abort or leak" ;;
  4) verdict="FAILED: an input ran longer than the timeout" ;;
  71) verdict="FAILED: out of memory (-rss_limit_mb)" ;;
  77) verdict="FAILED: the fuzzer exited 77 (not a skip: the fuzzer is built)"; rc=1 ;;
  *) verdict="FAILED: fuzzer exit $rc" ;;
esac
echo "fuzz: corpus grew from $(ls "$SEEDS" | wc -l) to $(ls "$WORK" | wc -l) inputs in $(( $(date +%s) - start ))s; $verdict; exit $rc"
[ "$rc" = 0 ] || ls -l "$ARTIFACTS" | tail -n 5
exit "$rc"
