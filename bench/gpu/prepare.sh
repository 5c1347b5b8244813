#!/usr/bin/env bash
# Prepares, on a build host, what a run on a host with a GPU needs that such a host cannot make
# itself (it has cmake, nvcc, python3 with numpy and grpcio, but no gRPC C++ libraries, no
# GoogleTest and no package registry). The three folders are git-ignored and travel beside the
# working tree:
#   .deps/googletest  GoogleTest sources (from Debian's googletest package) for the kernels-only
#                     build of the kernel GPU tests (bench/gpu/kernels.sh, bench/gpu/tests.sh)
#   .whl/             wheels of tritonclient and its pure-Python (or per-Python-version) dependencies,
#                     and perf_analyzer with its libraries, for tests/server_gpu/test_cuda_server.py;
#                     bench/gpu/tests.sh installs them with `pip install --no-index --find-links .whl`
#                     into a temporary folder
#   .gpu/             the relocatable bundle of a CUDA build (server, health, bench and their shared
#                     libraries) plus the server's GPU test and cold-start binaries (bench/gpu/tests.sh,
#                     bench/gpu/e2e.sh)
# usage: bench/gpu/prepare.sh [BUILD_DIR]
#   BUILD_DIR (default build-cuda) is a CUDA build of the server and its tests, e.g.
#     BUILD_DIR=build-cuda FLASHQ_CUDA_ARCHS=90a-real scripts/build.sh
#   Without one (the default folder missing), .gpu is not made: bench/gpu/kernels.sh needs only .deps.
#   FLASHQ_SKIP_WHEELS=1 leaves .whl alone; FLASHQ_PREP_KERNEL_TESTS=1 adds the kernel GPU test
#   binaries to .gpu (16 MB), for bench/gpu/e2e.sh to run directly (bench/gpu/tests.sh builds them on
#   the GPU host from source).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
mkdir -p .deps
if [ ! -f .deps/googletest/CMakeLists.txt ]; then
  [ -d /usr/src/googletest ] || { apt-get install -y -q googletest >/dev/null; }
  cp -r /usr/src/googletest .deps/googletest
fi
echo ".deps ready: $(du -sh .deps | cut -f1)"

# tritonclient's grpc client imports grpc (the GPU host has it), google.protobuf, rapidjson (a C
# extension: one wheel per CPython version, since the host's python3 version is not fixed),
# numpy (present) and packaging; urllib3 comes along for tritonclient.utils' http side. safetensors
# (one abi3 wheel) lets tools/ write Hugging Face checkpoints there (the load-time measurement).
# cuda-python 12.9 (cuda.cudart, which tritonclient.utils.cuda_shared_memory imports; 13.x dropped
# that module) runs on the host's CUDA 13 driver for the CUDA shared-memory test.
if [ "${FLASHQ_SKIP_WHEELS:-0}" != 1 ]; then
  mkdir -p .whl
  PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
        --platform manylinux1_x86_64 --platform any)
  for py in 311 312 313; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
      "${PLAT[@]}" -d .whl python-rapidjson==1.20
  done
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 312 --implementation cp "${PLAT[@]}" \
    -d .whl tritonclient==2.50.0 protobuf==4.25.9 urllib3==2.2.3 packaging==24.2 safetensors==0.8.0 \
    cuda-python==12.9.10 cuda-bindings==12.9.10 cuda-pathfinder==1.9.1
  # tritonclient's wheel carries 14 MB of data files (perf_analyzer and its libraries) that the
  # Python client does not use; the trimmed wheel keeps the carried tree small.
  python3 - .whl/tritonclient-2.50.0-*.whl <<'EOF'
import os, sys, zipfile
path = sys.argv[1]
src = zipfile.ZipFile(path)
if any(".data/data/" in n for n in src.namelist()):
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            if ".data/data/" in info.filename:
                continue
            data = src.read(info.filename)
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"\n".join(l for l in data.split(b"\n") if b".data/data/" not in l)
            dst.writestr(info, data)
    os.replace(tmp, path)
EOF
  # perf_analyzer (the wheel's binary), with the libraries it needs beyond the GPU host's own:
  # libb64 (Debian's) and libcudart.so.12 (the nvidia-cuda-runtime-cu12 wheel; the host has CUDA
  # 13), for the GPU conformance test's --shared-memory=cuda step.
  PA=$(scripts/perf_analyzer --path)
  PA_DIR=$(mktemp -d)/perf_analyzer && mkdir -p "$PA_DIR/lib"
  cp "$PA" "$PA_DIR/perf_analyzer"
  cp -L /usr/lib/x86_64-linux-gnu/libb64.so.0d .venv/lib/python3*/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12 \
    "$PA_DIR/lib/"
  tar czf .whl/perf_analyzer.tar.gz -C "$(dirname "$PA_DIR")" perf_analyzer && rm -rf "$(dirname "$PA_DIR")"
  echo ".whl ready: $(du -sh .whl | cut -f1) ($(ls .whl | wc -l) files)"
fi

# The CUDA build's bundle and test binaries.
if [ $# -eq 0 ] && [ ! -d build-cuda ]; then
  echo ".gpu not made: no CUDA build in build-cuda (give its folder as the argument)"
  exit 0
fi
BUILD=$(cd "${1:-build-cuda}" && pwd)
[ -x "$BUILD/bin/flashq_server_gpu_tests" ] || { echo "$BUILD has no bin/flashq_server_gpu_tests: not a CUDA build"; exit 1; }
rm -rf .gpu && mkdir -p .gpu/bin
deploy/bundle.sh --build-dir "$BUILD" --out-dir "$ROOT/.gpu" >/dev/null
cp "$BUILD/bin/flashq_server_gpu_tests" "$BUILD/bin/flashq-coldstart" .gpu/bin/
if [ "${FLASHQ_PREP_KERNEL_TESTS:-0}" = 1 ]; then
  for t in attention_gpu_test gemm_gpu_test; do
    [ -x "$BUILD/bin/$t" ] && cp "$BUILD/bin/$t" .gpu/bin/
  done
fi
git rev-parse HEAD > .gpu/COMMIT
echo ".gpu ready: $(du -sh .gpu | cut -f1)"
