#!/usr/bin/env bash
# The attention work in one run on a host with a GPU: build (kernels only, sm_90a), the tests,
# the benchmark with peers (its correctness checks first), then compute-sanitizer memcheck and
# racecheck on the test shapes. Exits non-zero if the build, a test, a benchmark check or a
# sanitizer failed (a sanitizer skipped for lack of time counts as failed). Logs and results go
# to $OUT (default ./out).
# Prepare with scripts/gpu-prep.sh (.deps: GoogleTest sources), then on the GPU host:
#   FLASHQ_COMMIT=<hash> bench/attention/gpu_run.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
FAILS=()
check() { [ "$2" = 0 ] || FAILS+=("$1 (exit $2)"); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$OUT/attn_env.txt"
if ! cmake -S . -B build-gpu -G Ninja -DFLASHQ_KERNELS_ONLY=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real >"$OUT/attn_build.log" 2>&1; then
  echo "full-tree configure failed; using bench/attention/standalone"; tail -5 "$OUT/attn_build.log"
  rm -rf build-gpu
  cmake -S bench/attention/standalone -B build-gpu -G Ninja -DCMAKE_CUDA_ARCHITECTURES=90a-real >>"$OUT/attn_build.log" 2>&1
fi
cmake --build build-gpu -j16 --target attention_gpu_test attention_ref_test attention_bench >>"$OUT/attn_build.log" 2>&1
BUILD_RC=$?
echo "build rc=$BUILD_RC at $(el)s"; grep -E "error|warning: .*spill|bytes spill" "$OUT/attn_build.log" | head -20
[ $BUILD_RC -eq 0 ] || { tail -40 "$OUT/attn_build.log"; echo "FAILED: build"; exit 1; }
echo "SASS: HGMMA $(cuobjdump --dump-sass build-gpu/bin/attention_bench 2>/dev/null | grep -c HGMMA), HMMA $(cuobjdump --dump-sass build-gpu/bin/attention_bench 2>/dev/null | grep -c HMMA)"
timeout 200 build-gpu/bin/attention_ref_test >"$OUT/attn_tests.log" 2>&1; REF_RC=$?
timeout 240 build-gpu/bin/attention_gpu_test >>"$OUT/attn_tests.log" 2>&1; GPU_RC=$?
check "attention_ref_test" $REF_RC
check "attention_gpu_test" $GPU_RC
echo "tests: ref rc=$REF_RC gpu rc=$GPU_RC at $(el)s"
grep -E "^\[  (FAILED|PASSED) |tests ran" "$OUT/attn_tests.log" | sort | uniq -c | head -40
grep -B2 -A6 "Failure" "$OUT/attn_tests.log" | head -60
FLASHQ_COMMIT=${FLASHQ_COMMIT:-unknown} timeout 300 bench/attention/run.sh build-gpu "$OUT" >"$OUT/attn_bench.log" 2>&1
BENCH_RC=$?
check "benchmark (checks or peers)" $BENCH_RC
echo "bench rc=$BENCH_RC at $(el)s"; tail -45 "$OUT/attn_bench.log"
SAN_FILTER='*bf16_hd128_causal_gqa4*:*bf16_hd64_full_gqa1*:*fp16_hd256_causal_gqa8*:*PagedGpuTest*bf16_hd128*page16_q3*:*PagedGpuTest*fp16_hd64*gqa4*:*PagedGpuTest*bf16_hd256*gqa8*:PagedGpu.*:-Long*'
LEFT=$(( 560 - $(el) ))
if [ $LEFT -gt 40 ]; then
  timeout $(( LEFT / 2 )) compute-sanitizer --tool memcheck --error-exitcode 9 build-gpu/bin/attention_gpu_test \
    --gtest_filter="$SAN_FILTER" >"$OUT/attn_sanitizer.log" 2>&1
  MEM_RC=$?
  check "memcheck" $MEM_RC
  echo "memcheck rc=$MEM_RC at $(el)s"
  LEFT=$(( 580 - $(el) ))
  timeout $LEFT compute-sanitizer --tool racecheck --error-exitcode 9 build-gpu/bin/attention_gpu_test \
    --gtest_filter="$SAN_FILTER" >>"$OUT/attn_sanitizer.log" 2>&1
  RACE_RC=$?
  check "racecheck" $RACE_RC
  echo "racecheck rc=$RACE_RC at $(el)s"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$OUT/attn_sanitizer.log" | head
else
  echo "no time left for compute-sanitizer"
  FAILS+=("compute-sanitizer (no time left)")
fi
if [ ${#FAILS[@]} -gt 0 ]; then
  printf 'FAILED: %s\n' "${FAILS[@]}"
  exit 1
fi
echo "PASSED: build, tests, benchmark checks, memcheck, racecheck"
