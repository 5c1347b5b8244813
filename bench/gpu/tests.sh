#!/usr/bin/env bash
# The GPU verdict: every GPU test, sanitizer run and correctness check, with ONE exit status that
# is non-zero if any of them failed, timed out or was skipped (on a host with a GPU, a skip means
# the check did not run). A short PASS/FAIL table is printed last; logs go under $OUT.
#
# Prepare on a build host (bench/gpu/prepare.sh), then run on a host with a GPU (CUDA 13 with cmake,
# nvcc and compute-sanitizer; python3 with numpy and grpcio), with the working tree and the
# git-ignored folders .deps .gpu .whl beside it:
#   bench/gpu/tests.sh              # OUT=<dir> for the logs (default ./out)
#
# What runs (about 6-8 minutes on an H200 with 16 cores; independent steps overlap):
#   kernels      kernels-only build from source and `ctest -L gpu` (attention and gemm GPU tests,
#                long contexts included)
#   attn-bench   attention_bench --check-only: every benchmark configuration against float64
#   san-*        compute-sanitizer memcheck and racecheck on subsets of the kernel tests
#   server       the server's CUDA backend tests (.gpu/bin/flashq_server_gpu_tests), then memcheck
#   conformance  tests/server_gpu/test_cuda_server.py: flashq-server --backend=cuda through
#                tritonclient against float64 numpy references, then SIGTERM with work in flight
# FLASHQ_GPU_TESTS_BUDGET_S (default 480) bounds the whole run; a step cut short by it fails.
# FLASHQ_CUDA_ARCHS (default 90a-real) and FLASHQ_JOBS (default: every core) shape the build.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
. bench/gpu/lib.sh
start_run "${FLASHQ_GPU_TESTS_BUDGET_S:-480}"
device_info | tee "$OUT/device.txt"
require_gpu

# ---- the server side: prebuilt in .gpu (a GPU host without gRPC cannot build it) ---------------
server_steps() {
  local t B
  if ! ls .gpu/flashq-bundle-*.tar.gz >/dev/null 2>&1 || [ ! -x .gpu/bin/flashq_server_gpu_tests ]; then
    record server FAIL 0 "no .gpu bundle (bench/gpu/prepare.sh)"
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
    # perf_analyzer for the CUDA shared-memory step (bench/gpu/prepare.sh packs it with its libraries).
    rm -rf /tmp/fq-pa && mkdir -p /tmp/fq-pa && tar xzf "$ROOT/.whl/perf_analyzer.tar.gz" -C /tmp/fq-pa 2>/dev/null &&
      printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/fq-pa/perf_analyzer/lib exec /tmp/fq-pa/perf_analyzer/perf_analyzer "$@"\n' \
        > /tmp/fq-pa/run && chmod +x /tmp/fq-pa/run && export FLASHQ_PERF_ANALYZER=/tmp/fq-pa/run
    PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} FLASHQ_TEST_TMP=/tmp/fq-conformance \
      timeout "$(cap 300)" python3 tests/server_gpu/test_cuda_server.py --backend=cuda --server="$B/bin/flashq-server" \
      > "$LOGS/conformance.log" 2>&1
    verdict conformance $? "$t" "$(grep -E '^conformance' "$LOGS/conformance.log" | tail -n1)"
  ) &
  local conf=$!
  t=$(date +%s)
  timeout "$(left)" compute-sanitizer --tool memcheck --error-exitcode 9 .gpu/bin/flashq_server_gpu_tests \
    --gtest_filter="$SAN_SERVER" > "$LOGS/server_memcheck.log" 2>&1
  verdict server-memcheck $? "$t" "$(grep -E 'ERROR SUMMARY' "$LOGS/server_memcheck.log" | tail -n1)"
  wait $conf
}
server_steps > "$LOGS/server_steps.out" 2>&1 &
SERVER_PID=$!

# ---- the kernels: built here from source, kernels only ------------------------------------------
t=$(date +%s)
kernels_build "$LOGS/kernels_build.log" attention_gpu_test attention_ref_test gemm_gpu_test gemm_cpu_test attention_bench
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
  san san-attn-memcheck memcheck build-gpu/bin/attention_gpu_test "$SAN_ATTENTION" & P3=$!
  san san-attn-racecheck racecheck build-gpu/bin/attention_gpu_test "$SAN_ATTENTION_RACE" & P4=$!
  san san-gemm-memcheck memcheck build-gpu/bin/gemm_gpu_test "$SAN_GEMM_MEMCHECK" & P5=$!
  san san-gemm-racecheck racecheck build-gpu/bin/gemm_gpu_test "$SAN_GEMM_RACECHECK" & P6=$!
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
STEPS=(kernel-build kernel-tests attn-bench san-attn-memcheck san-attn-racecheck san-gemm-memcheck
       san-gemm-racecheck server server-memcheck conformance)
{  # no pipe here: summary sets FAILED in this shell
  summary "GPU verdict ($(head -n1 "$OUT/device.txt" | cut -c7-), $(sed -n 4p "$OUT/device.txt"), $(el)s; logs in $OUT/logs.tgz)" "${STEPS[@]}"
  [ $FAILED = 0 ] && echo "GPU verdict: PASS" || echo "GPU verdict: FAIL ($FAILED of ${#STEPS[@]} checks)"
} > "$OUT/verdict.txt"
cat "$OUT/verdict.txt"
[ $FAILED = 0 ]
