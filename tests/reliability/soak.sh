#!/usr/bin/env bash
# The long soak (not run in CI): a mixed workload with cancellations, short deadlines,
# KV sessions and streams against one flashq-server for DURATION seconds (default 600),
# then SIGTERM. Fails if any request is lost or answered twice, an unexpected status
# appears, the server exits non-zero, or RSS grows by more than 64 MB after warm-up.
# Writes bench/results/reliability-soak.json (reliability-soak-asan.json with SANITIZER=1); the file records
# the date, commit and build, and a new run replaces it.
#
#   tests/reliability/soak.sh [DURATION] [SERVER]     # default build-rel/bin/flashq-server
#   SANITIZER=1 tests/reliability/soak.sh 600 build-fuzz/bin/flashq-server   # ASan/LSan build
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
DURATION="${1:-600}"
SERVER="${2:-$ROOT/build-rel/bin/flashq-server}"
SUFFIX=""
if [ "${SANITIZER:-0}" = 1 ]; then SUFFIX="-asan"; fi
OUT="$ROOT/bench/results/reliability-soak$SUFFIX.json"
mkdir -p "$ROOT/bench/results"
export FLASHQ_TEST_TMP="${FLASHQ_TEST_TMP:-$(dirname "$SERVER")/../reliability/soak}"
args=(--server "$SERVER" --duration "$DURATION" --clients "${CLIENTS:-4}" --out "$OUT" --verbose)
if [ "${SANITIZER:-0}" = 1 ]; then args+=(--sanitizer --rss-bound-mb 0); fi
"$ROOT/.venv/bin/python" "$ROOT/tests/reliability/soak.py" "${args[@]}"
echo "soak: result in $OUT"
