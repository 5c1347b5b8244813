#!/usr/bin/env bash
# Nsight Compute on one launch of the Hopper prefill kernel and one of the decode kernel (on a host with a GPU).
# usage: bench/attention/profile.sh [BUILD_DIR] [OUT_DIR]; clocks are left alone (--clock-control none).
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-gpu}; OUT=${2:-out}
SECTIONS="--section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SchedulerStats --section Occupancy"
ncu --clock-control none -k regex:PrefillWgmma --launch-count 1 $SECTIONS \
  "$BUILD/bin/attention_bench" --quick --filter hd128_b4_l4k_full --json /tmp/p1.json >"$OUT/attn_ncu_prefill.txt" 2>&1
echo "ncu prefill rc=$?"
ncu --clock-control none -k regex:PagedDecodeKernel --launch-count 1 $SECTIONS \
  "$BUILD/bin/attention_bench" --quick --filter decode_b32_l4096_page16_split0 --json /tmp/p2.json >"$OUT/attn_ncu_decode.txt" 2>&1
echo "ncu decode rc=$?"
for f in "$OUT/attn_ncu_prefill.txt" "$OUT/attn_ncu_decode.txt"; do
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L2 Cache Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Stall|One or More Eligible|L1/TEX Hit|L2 Hit|Bank" "$f" | head -30
done
