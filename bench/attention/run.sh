#!/usr/bin/env bash
# Attention benchmark, ours and PyTorch peers in one run (on a host with a GPU).
# usage: bench/attention/run.sh [BUILD_DIR] [OUT_DIR]   (FLASHQ_COMMIT names the commit in the results)
# Writes OUT_DIR/attention_ours.json and OUT_DIR/attention-<device>.{json,md} (bench/results/attention-nvidia-h200.*
# is the current record of an H200; a new run replaces it).
# Exits non-zero when a correctness check of attention_bench failed (after the peers still ran,
# so the record shows the failed check beside the timings) or when the peers failed.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-gpu}
OUT_DIR=${2:-bench/results}
mkdir -p "$OUT_DIR"
rm -f "$OUT_DIR/attention_ours.json"
rc=0
"$BUILD/bin/attention_bench" --json "$OUT_DIR/attention_ours.json" ${FLASHQ_BENCH_QUICK:+--quick} || rc=$?
[ -s "$OUT_DIR/attention_ours.json" ] || { echo "attention_bench wrote no results (exit $rc)"; exit 1; }
python3 bench/attention/peers.py --ours "$OUT_DIR/attention_ours.json" --out-dir "$OUT_DIR" \
  --commit "${FLASHQ_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
exit $rc
