#!/usr/bin/env bash
# The gemm work in one run on a host with a GPU: build (kernels only), GPU + CPU gemm tests,
# compute-sanitizer on a test subset, our benchmark, the torch peers, and the report.
# Exits non-zero if the build, a test, the benchmark (its correctness checks included), the
# peers, the report or a sanitizer failed; the report still runs first.
# Usage (repo root, on the GPU host): OUT=/some/dir bench/gemm/run_gpu.sh [--quick] [--no-sanitizer]
set -uo pipefail
FAILS=()
check() { [ "$2" = 0 ] || FAILS+=("$1 (exit $2)"); }
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
QUICK=""; SAN=1
for a in "$@"; do [ "$a" = --quick ] && QUICK=--quick; [ "$a" = --no-sanitizer ] && SAN=0; done
LOG="$OUT/gemm-log.txt"
# BIN=<dir with prebuilt gemm_* binaries> skips the build (binaries built elsewhere with nvcc 13, sm_90a); it needs
# COMMIT=<sha they were built from>.
B=${BIN:-build-gpu/bin}
if [ -n "${BIN:-}" ] && [ -z "${COMMIT:-}" ]; then echo "BIN=$BIN needs COMMIT=<the commit its binaries were built from>"; exit 2; fi
{
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv || true
  if [ -z "${BIN:-}" ]; then
    cmake -S . -B build-gpu -G Ninja -DFLASHQ_KERNELS_ONLY=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real >/dev/null &&
    cmake --build build-gpu -j16 --target gemm_gpu_test gemm_cpu_test gemm_bench 2>&1 | grep -E "error|warning|registers|spill|FAILED" | grep -v "0 bytes spill" | head -60
  fi
} >"$LOG" 2>&1
[ -x $B/gemm_bench ] || { echo "BUILD FAILED"; tail -40 "$LOG"; exit 1; }
$B/gemm_cpu_test --gtest_brief=1 >>"$LOG" 2>&1; rc=$?; check "cpu tests" $rc; echo "cpu tests rc=$rc" | tee -a "$LOG"
timeout 240 $B/gemm_gpu_test --gtest_brief=1 >>"$LOG" 2>&1; rc=$?; check "gpu tests" $rc; echo "gpu tests rc=$rc" | tee -a "$LOG"
grep -E "FAILED|Failure|error" "$LOG" | head -30
timeout 300 $B/gemm_bench $QUICK --out "$OUT/gemm_ours.json" >"$OUT/gemm_bench.txt" 2>&1; rc=$?; check "bench" $rc; echo "bench rc=$rc"
tail -3 "$OUT/gemm_bench.txt"
PYTHONUNBUFFERED=1 timeout 240 python3 bench/gemm/torch_peers.py $QUICK --out "$OUT/gemm_torch.json" >"$OUT/gemm_torch.txt" 2>&1
rc=$?; check "torch peers" $rc; echo "torch rc=$rc"
tail -3 "$OUT/gemm_torch.txt"
python3 bench/gemm/report.py --ours "$OUT/gemm_ours.json" --torch "$OUT/gemm_torch.json" --outdir "$OUT" \
  --commit "${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}" --date "$(date -u +%F)" | tail -45
check "report" "${PIPESTATUS[0]}"
if [ $SAN = 1 ]; then
  timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $B/gemm_gpu_test --gtest_brief=1 \
    --gtest_filter='Shapes/GemmGpuW4.*/1:Shapes/GemmGpuW4.*/4:Shapes/GemmGpuW4.*/6:Modes/GemmGpuFp8.*/0:Scales/*:GemmGpu.W4A16ShapeErrors*:GemmGpu.W4A16StagedKernelKeepsTheBits:GemmGpu.W8A16StagedKernelKeepsTheBits:GemmGpu.W4A16StripPairsKeepTheBits' >>"$LOG" 2>&1
  rc=$?; check "memcheck" $rc; echo "compute-sanitizer memcheck rc=$rc" | tee -a "$LOG"
  # The steady-pass and resident-grid tests run wgmma blocks of more stages than the ring holds, so the ring's refills
  # (bulk copies into slots that warps have read) are checked too; the staged test, the small-M kernel whose weights and
  # X arrive by bulk copies; the strip pairs, whose sums cross into the partner block's shared memory.
  timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 $B/gemm_gpu_test --gtest_brief=1 \
    --gtest_filter='Shapes/GemmGpuW4.*/4:GemmGpu.W4A16SteadyPassesKeepTheBits:GemmGpu.W4A16ResidentGridFallbacksKeepTheBits:GemmGpu.W4A16StagedKernelKeepsTheBits:GemmGpu.W8A16StagedKernelKeepsTheBits:GemmGpu.W4A16StripPairsKeepTheBits' >>"$LOG" 2>&1
  rc=$?; check "racecheck" $rc; echo "compute-sanitizer racecheck rc=$rc" | tee -a "$LOG"
fi
grep -E "ERROR SUMMARY|rc=" "$LOG" | tail -8
if [ ${#FAILS[@]} -gt 0 ]; then
  printf 'FAILED: %s\n' "${FAILS[@]}"
  exit 1
fi
echo "PASSED: tests, benchmark, peers, report$([ $SAN = 1 ] && echo ', memcheck, racecheck')"
