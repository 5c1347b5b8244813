#!/usr/bin/env bash
# The kernel benchmarks with their peers, on a host with a GPU: a kernels-only build from source, the
# suite's tests, our benchmark (each configuration checked against float64 before it is timed), the
# PyTorch peers in the same run and the report, then compute-sanitizer memcheck and racecheck on the
# suite's test subset. Results, logs and a PASS/FAIL table go to $OUT; the exit status is non-zero if
# any step failed, timed out or was cut short by the time budget.
#
# usage: bench/gpu/kernels.sh [attention] [gemm] [options]      (no suite named: both)
#   --quick             fewer repetitions (attention_bench, gemm_bench and the peers)
#   --filter=PATTERN    attention: only the benchmark configurations whose name matches (peers for
#                       those rows only)
#   --tests=FILTER      GoogleTest filter of the GPU tests; the CPU-reference tests are then left out
#   --no-tests          no tests
#   --no-peers          our benchmark alone (no peers, no report)
#   --sanitize=FILTER   the sanitizers on FILTER instead of the suite's subset
#   --no-sanitizer      no compute-sanitizer
#   --profile[=REGEX@CONFIG]  attention: Nsight Compute (clocks left alone) on one launch of the Hopper
#                       prefill kernel and one of the decode kernel, or of the kernels matching REGEX
#                       in the benchmark configuration CONFIG
# Environment: OUT (default ./out); FLASHQ_COMMIT, the commit the results name (default: git HEAD);
# BIN=<dir> runs binaries built elsewhere (nvcc 13) instead of building, and then needs FLASHQ_COMMIT;
# FLASHQ_KERNELS_BUDGET_S (default 1200) bounds the whole run; FLASHQ_CUDA_ARCHS (default 90a-real) and
# FLASHQ_JOBS (default: every core) shape the build. The GPU host needs .deps (bench/gpu/prepare.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
. bench/gpu/lib.sh

SUITES=() QUICK="" FILTER="" TESTS="" RUN_TESTS=1 PEERS=1 SANITIZE="" RUN_SAN=1 PROFILE=""
for a in "$@"; do
  case $a in
    attention|gemm) SUITES+=("$a") ;;
    --quick) QUICK=--quick ;;
    --filter=*) FILTER=${a#*=} ;;
    --tests=*) TESTS=${a#*=} ;;
    --no-tests) RUN_TESTS=0 ;;
    --no-peers) PEERS=0 ;;
    --sanitize=*) SANITIZE=${a#*=} ;;
    --no-sanitizer) RUN_SAN=0 ;;
    --profile) PROFILE=default ;;
    --profile=*) PROFILE=${a#*=} ;;
    *) echo "unknown argument '$a' (see the top of $0)"; exit 2 ;;
  esac
done
[ ${#SUITES[@]} -gt 0 ] || SUITES=(attention gemm)
has() { [[ " ${SUITES[*]} " == *" $1 "* ]]; }
if [ -n "${BIN:-}" ] && [ -z "${FLASHQ_COMMIT:-}" ]; then
  echo "BIN=$BIN needs FLASHQ_COMMIT=<the commit its binaries were built from>"
  exit 2
fi
COMMIT=${FLASHQ_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
B=${BIN:-build-gpu/bin}
start_run "${FLASHQ_KERNELS_BUDGET_S:-1200}"
device_info | tee "$OUT/device.txt"
require_gpu
STEPS=()

# ---- build --------------------------------------------------------------------------------------
if [ -z "${BIN:-}" ]; then
  targets=()
  has attention && targets+=(attention_gpu_test attention_ref_test attention_bench)
  has gemm && targets+=(gemm_gpu_test gemm_cpu_test gemm_bench)
  t=$(date +%s)
  kernels_build "$LOGS/build.log" "${targets[@]}"
  rc=$?
  verdict build $rc "$t"
  STEPS+=(build)
  grep -E "error|bytes spill" "$LOGS/build.log" | grep -v " 0 bytes spill" | head -20
  if [ $rc != 0 ]; then
    tail -n 40 "$LOGS/build.log"
    summary "kernels ($COMMIT)" "${STEPS[@]}"
    exit 1
  fi
fi

# step NAME CAP_S COMMAND...: one step, its output in $LOGS/NAME.log, bounded by CAP_S and the budget.
step() {
  local name=$1 limit=$2 t=$(date +%s)
  shift 2
  timeout "$(cap "$limit")" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  verdict "$name" $rc "$t" "$(grep -E '^\[  (PASSED|FAILED) |ERROR SUMMARY|RACECHECK SUMMARY' "$LOGS/$name.log" | tr '\n' ' ')"
  STEPS+=("$name")
  return $rc
}
# suite_tests SUITE CPU_TEST: the suite's tests (the CPU-reference ones unless --tests narrows the GPU ones).
suite_tests() {
  [ $RUN_TESTS = 1 ] || return 0
  [ -n "$TESTS" ] || step "$1-cpu-tests" 240 "$B/$2" --gtest_brief=1
  step "$1-gpu-tests" 240 "$B/$1_gpu_test" --gtest_brief=1 --gtest_filter="${TESTS:-*}"
  grep -B2 -A8 "Failure" "$LOGS/$1-gpu-tests.log" | head -40
}
# sanitize SUITE MEMCHECK_FILTER RACECHECK_FILTER
sanitize() {
  [ $RUN_SAN = 1 ] || return 0
  san "$1-memcheck" memcheck "$B/$1_gpu_test" "${SANITIZE:-$2}"
  san "$1-racecheck" racecheck "$B/$1_gpu_test" "${SANITIZE:-$3}"
  STEPS+=("$1-memcheck" "$1-racecheck")
}

# ---- attention ----------------------------------------------------------------------------------
if has attention; then
  echo "SASS: HGMMA $(cuobjdump --dump-sass "$B/attention_bench" 2>/dev/null | grep -c HGMMA)," \
    "HMMA $(cuobjdump --dump-sass "$B/attention_bench" 2>/dev/null | grep -c HMMA)"
  suite_tests attention attention_ref_test
  # A failed check still leaves the timings, so that the peers run and the record shows the failure.
  rm -f "$OUT/attention_ours.json"
  step attention-bench 300 "$B/attention_bench" ${FILTER:+--filter "$FILTER"} $QUICK --json "$OUT/attention_ours.json"
  tail -n 45 "$LOGS/attention-bench.log"
  if [ $PEERS = 1 ]; then
    if [ -s "$OUT/attention_ours.json" ]; then
      step attention-peers 240 python3 bench/attention/peers.py --ours "$OUT/attention_ours.json" --out-dir "$OUT" \
        --commit "$COMMIT"
      grep "^|" "$LOGS/attention-peers.log"
    else
      record attention-peers FAIL 0 "attention_bench wrote no results"
      STEPS+=(attention-peers)
    fi
  fi
  sanitize attention "$SAN_ATTENTION" "$SAN_ATTENTION_RACE"
  if [ -n "$PROFILE" ]; then
    SECTIONS=(--section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis
              --section MemoryWorkloadAnalysis --section SchedulerStats --section Occupancy)
    if [ "$PROFILE" = default ]; then
      PROFILES=("PrefillWgmma@hd128_b4_l4k_full" "PagedDecodeKernel@decode_b32_l4096_page16_split0")
    else
      PROFILES=("$PROFILE")
    fi
    i=0
    for p in "${PROFILES[@]}"; do
      i=$((i + 1))
      step "attention-ncu$i" 120 ncu --clock-control none -k "regex:${p%%@*}" --launch-count 1 "${SECTIONS[@]}" \
        "$B/attention_bench" --quick --filter "${p#*@}" --json "$LOGS/ncu$i.json"
      grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L2 Cache Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|No Eligible|Stall|One or More Eligible|Eligible Warps|Warp Cycles Per Issued|L1/TEX Hit|L2 Hit|Bank" \
        "$LOGS/attention-ncu$i.log" | head -30
    done
  fi
fi

# ---- gemm ---------------------------------------------------------------------------------------
if has gemm; then
  suite_tests gemm gemm_cpu_test
  step gemm-bench 300 "$B/gemm_bench" $QUICK --out "$OUT/gemm_ours.json"
  tail -n 3 "$LOGS/gemm-bench.log"
  if [ $PEERS = 1 ]; then
    PYTHONUNBUFFERED=1 step gemm-peers 240 python3 bench/gemm/torch_peers.py $QUICK --out "$OUT/gemm_torch.json"
    tail -n 3 "$LOGS/gemm-peers.log"
    step gemm-report 60 python3 bench/gemm/report.py --ours "$OUT/gemm_ours.json" --torch "$OUT/gemm_torch.json" \
      --outdir "$OUT" --commit "$COMMIT" --date "$(date -u +%F)"
    tail -n 45 "$LOGS/gemm-report.log"
  fi
  sanitize gemm "$SAN_GEMM_MEMCHECK" "$SAN_GEMM_RACECHECK"
fi

# ---- the table ----------------------------------------------------------------------------------
(cd "$OUT" && tar czf logs.tgz logs && rm -rf logs)
{  # no pipe here: summary sets FAILED in this shell
  summary "kernels ${SUITES[*]} ($COMMIT, $(sed -n 4p "$OUT/device.txt"), $(el)s; logs in $OUT/logs.tgz)" "${STEPS[@]}"
  [ $FAILED = 0 ] && echo "kernels: PASS" || echo "kernels: FAIL ($FAILED of ${#STEPS[@]} steps)"
} > "$OUT/kernels.txt"
cat "$OUT/kernels.txt"
[ $FAILED = 0 ]
