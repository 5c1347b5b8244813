#!/usr/bin/env bash
# Prepares .gpu/ (git-ignored; it travels beside the working tree to the GPU host) for
# bench/gpu-tests.sh and bench/e2e/gpu-run.sh: the relocatable bundle of a CUDA build (server,
# health, bench + their shared libraries) plus the server's GPU test and cold-start binaries.
# Usage: bench/e2e/gpu-prep.sh [BUILD_DIR]   (default build-cuda; FLASHQ_PREP_KERNEL_TESTS=1 adds
# the kernel GPU test binaries)
# Build first, e.g.: cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release
#   -DCMAKE_CUDA_ARCHITECTURES=90a-real && ninja -C build-cuda flashq-server flashq-health flashq-bench
#   flashq-coldstart flashq_server_gpu_tests attention_gpu_test gemm_gpu_test
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-cuda}
rm -rf "$ROOT/.gpu" && mkdir -p "$ROOT/.gpu/bin"
"$ROOT/deploy/bundle.sh" --build-dir "$BUILD" --out-dir "$ROOT/.gpu" >/dev/null
cp "$BUILD/bin/flashq_server_gpu_tests" "$BUILD/bin/flashq-coldstart" "$ROOT/.gpu/bin/"
# The kernel GPU tests, for gpu-run.sh to run directly: 16 MB, so only on request
# (bench/gpu-tests.sh builds them on the GPU host from source).
if [ "${FLASHQ_PREP_KERNEL_TESTS:-0}" = 1 ]; then
  for t in attention_gpu_test gemm_gpu_test; do
    [ -x "$BUILD/bin/$t" ] && cp "$BUILD/bin/$t" "$ROOT/.gpu/bin/"
  done
fi
git -C "$ROOT" rev-parse HEAD > "$ROOT/.gpu/COMMIT"
du -sh "$ROOT/.gpu"
