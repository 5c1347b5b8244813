#!/usr/bin/env bash
# One short iteration on a GPU host (a subset of gpu_run.sh): build kernels-only, run the GPU tests
# matching $TESTS, the benchmark configurations matching $BENCH (attention_bench --filter; peers
# for those rows only), then compute-sanitizer on $SAN tests. Everything lands in $OUT/iter.tgz.
# usage: TESTS='*Paged*' BENCH=decode_ SAN='*PagedGpuTest*bf16_hd128*page16_q3*' bench/attention/gpu_iter.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out}; L=$OUT/iter; mkdir -p "$L"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader | tee "$L/env.txt"
cmake -S . -B build-gpu -G Ninja -DFLASHQ_KERNELS_ONLY=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real >"$L/build.log" 2>&1
cmake --build build-gpu -j16 --target attention_gpu_test attention_bench >>"$L/build.log" 2>&1
RC=$?; echo "build rc=$RC at $(el)s"; grep -E "error|bytes spill" "$L/build.log" | grep -v "PagedDecodeKernel.*256\|hd256" | head -20
if [ $RC -ne 0 ]; then tail -30 "$L/build.log"; tar czf "$OUT/iter.tgz" -C "$OUT" iter; exit 1; fi
timeout ${TEST_S:-150} build-gpu/bin/attention_gpu_test --gtest_filter="${TESTS:-*}" >"$L/tests.log" 2>&1
echo "tests rc=$? at $(el)s"; grep -E "^\[  (FAILED|PASSED) |tests ran" "$L/tests.log" | sort | uniq -c | head -20
grep -B2 -A8 "Failure" "$L/tests.log" | head -40
if [ -n "${BENCH:-}" ]; then
  build-gpu/bin/attention_bench --filter "$BENCH" ${QUICK:+--quick} --json "$L/ours.json" >"$L/bench.log" 2>&1
  echo "bench rc=$? at $(el)s"; cat "$L/bench.log"
  if [ -n "${PEERS:-}" ]; then
    timeout 150 python3 bench/attention/peers.py --ours "$L/ours.json" --out-dir "$L" --commit iter >"$L/peers.log" 2>&1
    echo "peers rc=$? at $(el)s"; grep "^|" "$L/peers.log"
  fi
fi
if [ -n "${SAN:-}" ]; then
  for tool in memcheck racecheck; do
    timeout ${SAN_S:-60} compute-sanitizer --tool $tool --error-exitcode 9 build-gpu/bin/attention_gpu_test \
      --gtest_filter="$SAN" >"$L/san_$tool.log" 2>&1
    echo "$tool rc=$? at $(el)s"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Hazard|Invalid" "$L/san_$tool.log" | head -5
  done
fi
if [ -n "${NCU_KERNEL:-}" ]; then  # one launch of a kernel (regex) under Nsight Compute, clocks left alone
  timeout ${NCU_S:-60} ncu --clock-control none -k "regex:$NCU_KERNEL" --launch-count 1 --section SpeedOfLight \
    --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy \
    build-gpu/bin/attention_bench --quick --filter "$NCU_FILTER" --json /tmp/ncu.json >"$L/ncu.txt" 2>&1
  echo "ncu rc=$? at $(el)s"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Stall|Achieved Occupancy|L2 Hit" "$L/ncu.txt" | head -24
fi
tar czf "$OUT/iter.tgz" -C "$OUT" iter
