#!/usr/bin/env bash
# The GPU verdict: every GPU test, sanitizer run and correctness check, with ONE exit status that
# is non-zero if any of them failed, timed out or was skipped (on a host with a GPU, a skip means
# the check did not run). A short PASS/FAIL table is printed last; logs go under $OUT.
#
# Prepare on a build host (no GPU needed; nvcc 13, gRPC and the Python venv):
#   BUILD_DIR=build FLASHQ_CUDA_ARCHS=90a-real scripts/build.sh   # the CUDA build of the server
#   bench/e2e/gpu-prep.sh build     # .gpu/: relocatable server bundle + the server's GPU test binary
#   scripts/gpu-prep.sh             # .deps/: GoogleTest sources; .whl/: tritonclient and its wheels
# then, with the working tree and the git-ignored folders .deps .gpu .whl beside it, on a host with
# a GPU (CUDA 13 with cmake, nvcc and compute-sanitizer; python3 with numpy and grpcio):
#   bash bench/gpu-tests.sh         # OUT=<dir> for the logs (default ./out)
#
# What runs (about 6-8 minutes on an H200 with 16 cores; independent steps overlap):
#   kernels      kernels-only build from source (sm_90a) and `ctest -L gpu` (attention and gemm GPU
#                tests, long contexts included)
#   attn-bench   attention_bench --check-only: every benchmark configuration against float64
#   san-*        compute-sanitizer memcheck and racecheck on subsets of the kernel tests
#   server       the server's CUDA backend tests (.gpu/bin/flashq_server_gpu_tests), then memcheck
#   conformance  tests/server_gpu/test_cuda_server.py: flashq-server --backend=cuda through
#                tritonclient against float64 numpy references, then SIGTERM with work in flight
# FLASHQ_GPU_TESTS_BUDGET_S (default 480) bounds the whole run; a step cut short by it fails.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOGS=$OUT/logs
mkdir -p "$LOGS"
T0=$(date +%s)
BUDGET=${FLASHQ_GPU_TESTS_BUDGET_S:-480}
JOBS=${FLASHQ_JOBS:-$(nproc)}
el() { echo $(( $(date +%s) - T0 )); }
left() { local l=$(( BUDGET - $(el) )); [ $l -gt 5 ] && echo $l || echo 5; }
cap() { local l=$(left); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }  # the smaller of $1 and what is left

# Each step writes "<status> <seconds> <note>" to $OUT/status/<name>; the table reads them.
mkdir -p "$OUT/status"
rm -f "$OUT"/status/*
record() { echo "$2 $3 ${4:-}" > "$OUT/status/$1"; echo "[$(el)s] $1: $2 ${4:-}"; }
# verdict NAME RC START [NOTE]: 0 passes; 124/137 (timeout) and anything else fail.
verdict() {
  local name=$1 rc=$2 t=$(( $(date +%s) - $3 )) note=${4:-}
  if [ "$rc" = 0 ]; then record "$name" PASS "$t" "$note"
  elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then record "$name" FAIL "$t" "timed out${note:+; $note}"
  elif [ "$rc" = 77 ]; then record "$name" FAIL "$t" "skipped (exit 77) on a GPU host${note:+; $note}"
  else record "$name" FAIL "$t" "exit $rc${note:+; $note}"
  fi
}

{
  echo "date: $(date -u +%FT%TZ)"
  echo "tree: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (modified)')"
  echo "bundle commit: $(cat .gpu/COMMIT 2>/dev/null || echo none)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
} | tee "$OUT/device.txt"
if ! nvidia-smi -L >/dev/null 2>&1; then
  echo "no GPU visible (nvidia-smi -L failed): nothing can be checked here"
  exit 77
fi

# ---- the server side: prebuilt in .gpu (this host has no gRPC to build it) ----------------------
server_steps() {
  local t B
  if ! ls .gpu/flashq-bundle-*.tar.gz >/dev/null 2>&1 || [ ! -x .gpu/bin/flashq_server_gpu_tests ]; then
    record server FAIL 0 "no .gpu bundle (bench/e2e/gpu-prep.sh)"
    record server-memcheck FAIL 0 "no .gpu bundle"
    record conformance FAIL 0 "no .gpu bundle"
    return
  fi
  rm -rf /tmp/fq-gpu-bundle && mkdir -p /tmp/fq-gpu-bundle
  tar xzf .gpu/flashq-bundle-*.tar.gz -C /tmp/fq-gpu-bundle
  B=$(ls -d /tmp/fq-gpu-bundle/flashq-bundle-* | head -n1)
  local host_ld=${LD_LIBRARY_PATH:-}
  export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

  t=$(date +%s)
  timeout "$(cap 240)" .gpu/bin/flashq_server_gpu_tests > "$LOGS/server_gpu_tests.log" 2>&1
  verdict server $? "$t" "$(grep -E '^\[  (PASSED|FAILED) ' "$LOGS/server_gpu_tests.log" | tr '\n' ' ')"

  # The conformance test's server and the memcheck run share the GPU; each has its own process.
  # Python keeps the host's libraries; the bundle's launcher (bin/) sets them for the server alone.
  (
    export LD_LIBRARY_PATH=$host_ld
    t=$(date +%s)
    SITE=/tmp/fq-site
    rm -rf "$SITE" && mkdir -p "$SITE"
    if python3 -m pip --version >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --find-links "$ROOT/.whl" --target "$SITE" \
        tritonclient python-rapidjson protobuf urllib3 packaging cuda-python cuda-bindings cuda-pathfinder \
        > "$LOGS/wheels.log" 2>&1
    else  # no pip: a wheel is a zip; take the ones this python3 can import
      python3 - "$ROOT/.whl" "$SITE" > "$LOGS/wheels.log" 2>&1 <<'EOF'
import glob, os, shutil, sys, zipfile
tag = "cp%d%d" % sys.version_info[:2]
for w in glob.glob(os.path.join(sys.argv[1], "*.whl")):
    parts = os.path.basename(w)[:-4].split("-")
    if parts[-3] in ("py3", "py2.py3") or parts[-3] == tag or "abi3" in parts[-2]:
        zipfile.ZipFile(w).extractall(sys.argv[2])
for lib in glob.glob(os.path.join(sys.argv[2], "*.data", "*lib")):  # purelib / platlib go to the top
    for name in os.listdir(lib):
        shutil.move(os.path.join(lib, name), os.path.join(sys.argv[2], name))
EOF
    fi
    # perf_analyzer for the CUDA shared-memory step (scripts/gpu-prep.sh packs it with its libraries).
    rm -rf /tmp/fq-pa && mkdir -p /tmp/fq-pa && tar xzf "$ROOT/.whl/perf_analyzer.tar.gz" -C /tmp/fq-pa 2>/dev/null &&
      printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/fq-pa/perf_analyzer/lib exec /tmp/fq-pa/perf_analyzer/perf_analyzer "$@"\n' \
        > /tmp/fq-pa/run && chmod +x /tmp/fq-pa/run && export FLASHQ_PERF_ANALYZER=/tmp/fq-pa/run
    PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} FLASHQ_TEST_TMP=/tmp/fq-conformance \
      timeout "$(cap 300)" python3 tests/server_gpu/test_cuda_server.py --backend=cuda --server="$B/bin/flashq-server" \
      > "$LOGS/conformance.log" 2>&1
    verdict conformance $? "$t" "$(grep -E '^conformance' "$LOGS/conformance.log" | tail -n1)"
  ) &
  local conf=$!
  # memcheck: the executor tests; the plain-reference scenarios repeat them at sizes too slow under
  # the sanitizer.
  t=$(date +%s)
  timeout "$(left)" compute-sanitizer --tool memcheck --error-exitcode 9 .gpu/bin/flashq_server_gpu_tests \
    --gtest_filter='-Cuda/PlainReferenceTest.*' > "$LOGS/server_memcheck.log" 2>&1
  verdict server-memcheck $? "$t" "$(grep -E 'ERROR SUMMARY' "$LOGS/server_memcheck.log" | tail -n1)"
  wait $conf
}
server_steps > "$LOGS/server_steps.out" 2>&1 &
SERVER_PID=$!

# ---- the kernels: built here from source, kernels only ------------------------------------------
t=$(date +%s)
cmake -S . -B build-gpu -G Ninja -DFLASHQ_KERNELS_ONLY=ON -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_ARCHITECTURES=90a-real > "$LOGS/kernels_build.log" 2>&1 &&
  timeout "$(left)" cmake --build build-gpu -j"$JOBS" \
    --target attention_gpu_test attention_ref_test gemm_gpu_test gemm_cpu_test attention_bench >> "$LOGS/kernels_build.log" 2>&1
BUILD_RC=$?
verdict kernel-build $BUILD_RC "$t"
if [ $BUILD_RC = 0 ]; then
  # Every kernel check at once: the GPU has room for all of them.
  (
    t=$(date +%s)
    cd build-gpu && timeout "$(left)" ctest -L gpu -j6 --output-on-failure > "$LOGS/ctest_gpu.log" 2>&1
    rc=$?
    note=$(grep -E "tests passed|tests failed" "$LOGS/ctest_gpu.log" | tail -n1)
    # ctest exits 0 when tests are skipped; here a skip means a GPU test did not run.
    if [ $rc = 0 ] && grep -qE "Not Run|\(Skipped\)|\*\*\*Skipped" "$LOGS/ctest_gpu.log"; then rc=77; fi
    if [ $rc = 0 ] && ! grep -qE "100% tests passed(, 0 tests failed)? out of [1-9]" "$LOGS/ctest_gpu.log"; then rc=1; note="no test ran; $note"; fi
    verdict kernel-tests $rc "$t" "$note"
  ) &
  P1=$!
  (
    t=$(date +%s)
    timeout "$(left)" build-gpu/bin/attention_bench --check-only --json "$LOGS/attention_check.json" \
      > "$LOGS/attention_check.log" 2>&1
    verdict attn-bench $? "$t" "$(grep -cE ' ok$' "$LOGS/attention_check.log") checks ok, $(grep -cE 'FAIL$' "$LOGS/attention_check.log") failed"
  ) &
  P2=$!
  # The sanitizer subsets: shapes that cover each kernel's paths (TMA and cp.async tiles, GQA,
  # several splits, the ring refills of the gemm kernels) at sizes the tools finish in time.
  ATTN_SAN='*bf16_hd128_causal_gqa4*:*bf16_hd64_full_gqa1*:*fp16_hd256_causal_gqa8*:*PagedGpuTest*bf16_hd128*page16_q3*:*PagedGpuTest*fp16_hd64*gqa4*:*PagedGpuTest*bf16_hd256*gqa8*:PagedGpu.*:-Long*'
  GEMM_MEM='Shapes/GemmGpuW4.*/1:Shapes/GemmGpuW4.*/4:Shapes/GemmGpuW4.*/6:Modes/GemmGpuFp8.*/0:Scales/*:GemmGpu.W4A16ShapeErrors*:GemmGpu.W4A16StagedKernelKeepsTheBits:GemmGpu.W8A16StagedKernelKeepsTheBits:GemmGpu.W4A16StripPairsKeepTheBits'
  GEMM_RACE='Shapes/GemmGpuW4.*/4:GemmGpu.W4A16SteadyPassesKeepTheBits:GemmGpu.W4A16ResidentGridFallbacksKeepTheBits:GemmGpu.W4A16StagedKernelKeepsTheBits:GemmGpu.W8A16StagedKernelKeepsTheBits:GemmGpu.W4A16StripPairsKeepTheBits'
  san() {  # san NAME TOOL BINARY FILTER
    local t=$(date +%s)
    timeout "$(left)" compute-sanitizer --tool "$2" --error-exitcode 9 "build-gpu/bin/$3" --gtest_brief=1 \
      --gtest_filter="$4" > "$LOGS/$1.log" 2>&1
    local rc=$?
    # A filter that matches nothing passes vacuously: that is a failure here.
    if [ $rc = 0 ] && ! grep -qE "^\[  PASSED  \] [1-9]" "$LOGS/$1.log"; then rc=1; fi
    verdict "$1" $rc "$t" "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  PASSED' "$LOGS/$1.log" | tr '\n' ' ')"
  }
  san san-attn-memcheck memcheck attention_gpu_test "$ATTN_SAN" & P3=$!
  # Racecheck exits 9 on the multi-threaded launch test with no hazard reported; memcheck covers it, and
  # racecheck the same kernels in the single-thread cases. (Appended after -Long*, so it is excluded.)
  san san-attn-racecheck racecheck attention_gpu_test "$ATTN_SAN:PagedGpu.Concurrent*" & P4=$!
  san san-gemm-memcheck memcheck gemm_gpu_test "$GEMM_MEM" & P5=$!
  san san-gemm-racecheck racecheck gemm_gpu_test "$GEMM_RACE" & P6=$!
  wait $P1 $P2 $P3 $P4 $P5 $P6
else
  tail -n 30 "$LOGS/kernels_build.log"
  for s in kernel-tests attn-bench san-attn-memcheck san-attn-racecheck san-gemm-memcheck san-gemm-racecheck; do
    record $s FAIL 0 "kernel build failed"
  done
fi
wait $SERVER_PID
cat "$LOGS/server_steps.out"

# ---- the verdict ---------------------------------------------------------------------------------
(cd "$OUT" && tar czf logs.tgz logs && rm -rf logs)
FAILED=0
{  # no pipe here: FAILED must be counted in this shell
  echo
  echo "== GPU verdict ($(head -n1 "$OUT/device.txt" | cut -c7-), $(sed -n 4p "$OUT/device.txt"), $(el)s; logs in $OUT/logs.tgz)"
  printf '%-20s %-5s %6s  %s\n' check result secs note
  for s in kernel-build kernel-tests attn-bench san-attn-memcheck san-attn-racecheck san-gemm-memcheck \
           san-gemm-racecheck server server-memcheck conformance; do
    if [ -f "$OUT/status/$s" ]; then
      read -r st secs note < "$OUT/status/$s"
    else
      st=FAIL secs=- note="did not report"
    fi
    [ "$st" = PASS ] || FAILED=$((FAILED + 1))
    printf '%-20s %-5s %6s  %s\n' "$s" "$st" "$secs" "${note:0:150}"
  done
  [ $FAILED = 0 ] && echo "GPU verdict: PASS" || echo "GPU verdict: FAIL ($FAILED of 10 checks)"
} > "$OUT/verdict.txt"
cat "$OUT/verdict.txt"
[ $FAILED = 0 ]
