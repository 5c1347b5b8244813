#!/usr/bin/env bash
# Configures and builds flashq with CMake + Ninja. Incremental: rerunning only
# rebuilds what changed.
#
#   scripts/build.sh                       # everything, into build/
#   BUILD_DIR=build-ci scripts/build.sh    # another build folder
#   FLASHQ_CUDA_ARCHS=90a-real ...         # CUDA architectures (default: 80-real 89-real 90a-real)
#   FLASHQ_CUDA=OFF ...                    # CPU only, even where nvcc exists
#   FLASHQ_BUILD_TYPE=Debug ...            # default Release
#   FLASHQ_JOBS=2 ...                      # parallel jobs (default: number of cores)
#   scripts/build.sh -- flashq-server      # extra arguments go to `cmake --build` (e.g. a target)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
BUILD_DIR="${BUILD_DIR:-build}"
JOBS="${FLASHQ_JOBS:-$(nproc)}"

args=(-S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${FLASHQ_BUILD_TYPE:-Release}")
[ -n "${FLASHQ_CUDA_ARCHS:-}" ] && args+=("-DCMAKE_CUDA_ARCHITECTURES=${FLASHQ_CUDA_ARCHS// /;}")
[ -n "${FLASHQ_CUDA:-}" ] && args+=("-DFLASHQ_CUDA=${FLASHQ_CUDA}")
[ -n "${FLASHQ_CMAKE_ARGS:-}" ] && read -r -a extra <<<"$FLASHQ_CMAKE_ARGS" && args+=("${extra[@]}")

# A build folder configured by another generator (e.g. Makefiles) cannot be reused by Ninja.
if [ -f "$BUILD_DIR/CMakeCache.txt" ] && ! grep -q '^CMAKE_GENERATOR:INTERNAL=Ninja$' "$BUILD_DIR/CMakeCache.txt"; then
  echo "build: $BUILD_DIR was configured with another generator; reconfiguring from scratch"
  rm -rf "$BUILD_DIR/CMakeCache.txt" "$BUILD_DIR/CMakeFiles"
fi

[ "${1:-}" = "--" ] && shift
echo "build: cmake ${args[*]}"
cmake "${args[@]}"
echo "build: cmake --build $BUILD_DIR -j$JOBS $*"
cmake --build "$BUILD_DIR" -j"$JOBS" "$@"
echo "build: done; executables in $BUILD_DIR/bin: $(ls "$BUILD_DIR/bin" 2>/dev/null | tr '\n' ' ')"
