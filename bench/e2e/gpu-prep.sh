#!/usr/bin/env bash
# Prepares .gpu/ (git-ignored, travels with carry) for bench/e2e/gpu-run.sh: the
# relocatable bundle of a CUDA build (server, health, bench + their shared
# libraries) plus the GPU test and cold-start binaries.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-cuda}
rm -rf "$ROOT/.gpu" && mkdir -p "$ROOT/.gpu/bin"
"$ROOT/deploy/bundle.sh" --build-dir "$BUILD" --out-dir "$ROOT/.gpu" >/dev/null
cp "$BUILD/bin/flashq_server_gpu_tests" "$BUILD/bin/flashq-coldstart" "$ROOT/.gpu/bin/"
git -C "$ROOT" rev-parse HEAD > "$ROOT/.gpu/COMMIT"
du -sh "$ROOT/.gpu"
