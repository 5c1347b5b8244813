#!/usr/bin/env bash
# The GPU test suite in one call on the GPU machine, at the commit it is given:
# kernels built there (kernels only, sm_90a, 16 cores) and `ctest -L gpu`, then the
# server's CUDA backend tests from the carried CUDA build (.gpu, see
# bench/e2e/gpu-prep.sh), then compute-sanitizer memcheck on the server tests.
#   run(command="bash bench/gpu-tests.sh", carry=[".deps", ".gpu"])
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/tests_device.txt"
echo "commit: $(cat .gpu/COMMIT 2>/dev/null)" | tee -a "$OUT/tests_device.txt"
cmake -S . -B build-gpu -G Ninja -DFLASHQ_KERNELS_ONLY=ON -DCMAKE_CUDA_ARCHITECTURES=90a-real >"$OUT/tests_build.log" 2>&1 &&
  cmake --build build-gpu -j16 >>"$OUT/tests_build.log" 2>&1
echo "kernel build rc=$? at $(el)s"
(cd build-gpu && timeout 300 ctest -L gpu --output-on-failure -j1 > "$OUT/tests_kernels.log" 2>&1)
echo "ctest -L gpu rc=$? at $(el)s"; grep -E "tests passed|tests failed|Failed|\*\*\*" "$OUT/tests_kernels.log" | head -20
tar xzf .gpu/flashq-bundle-*.tar.gz -C /tmp
B=$(ls -d /tmp/flashq-bundle-* | head -n1)
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
timeout 120 .gpu/bin/flashq_server_gpu_tests > "$OUT/tests_server_gpu.log" 2>&1
echo "server CUDA backend tests rc=$? at $(el)s"; grep -E "PASSED|FAILED|Failure" "$OUT/tests_server_gpu.log" | head
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 .gpu/bin/flashq_server_gpu_tests > "$OUT/tests_server_memcheck.log" 2>&1
echo "memcheck on server CUDA backend tests rc=$? at $(el)s"; grep -E "ERROR SUMMARY|PASSED|FAILED" "$OUT/tests_server_memcheck.log" | head -5
