#!/usr/bin/env bash
# Runs the request fuzzer for a bounded time from the checked-in seed corpus and prints
# libFuzzer's final stats (executions, coverage, corpus). Exit status: libFuzzer's
# (non-zero on a crash, a sanitizer report, a leak or a timeout; the reproducer is
# written to ARTIFACTS).
#
#   fuzz/run.sh build-fuzz/bin/flashq_request_fuzzer 60 [ARTIFACTS] [extra libFuzzer flags]
set -euo pipefail
FUZZER="$1"
SECONDS_TO_RUN="${2:-60}"
ARTIFACTS="${3:-$(dirname "$FUZZER")/fuzz-artifacts}"
shift $(( $# < 3 ? $# : 3 ))
HERE="$(cd "$(dirname "$0")" && pwd)"
if [ ! -x "$FUZZER" ]; then echo "fuzz: $FUZZER not built: skipping"; exit 77; fi
mkdir -p "$ARTIFACTS"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/flashq-fuzz-corpus-XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
cp "$HERE"/corpus/* "$WORK"/
# Fuzzing the process's own threads: the harness waits for the scheduler's answer.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
echo "fuzz: $FUZZER for ${SECONDS_TO_RUN}s, corpus $WORK (seeds $(ls "$HERE"/corpus | wc -l)), artifacts $ARTIFACTS"
"$FUZZER" -max_total_time="$SECONDS_TO_RUN" -dict="$HERE/request.dict" -max_len=65536 -timeout=30 \
  -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$ARTIFACTS/" "$@" "$WORK" 2>&1 | \
  grep -v -E '^#[0-9]+\s+(NEW|REDUCE|pulse)' || true
rc=${PIPESTATUS[0]}
echo "fuzz: corpus grew from $(ls "$HERE"/corpus | wc -l) to $(ls "$WORK" | wc -l) inputs; exit $rc"
exit "$rc"
