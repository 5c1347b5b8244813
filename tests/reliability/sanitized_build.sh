#!/usr/bin/env bash
# Builds the sanitizer flavour that the CI reliability tests need, in its own folder:
# clang with ASan + UBSan (LeakSanitizer included), libFuzzer coverage on the server
# library, CPU backend only. Targets: flashq-server (for the LSan soak) and
# flashq_request_fuzzer. Exit 77 (ctest: skipped) when clang or libFuzzer is missing.
#
#   tests/reliability/sanitized_build.sh SOURCE_DIR BUILD_DIR [JOBS]
set -euo pipefail
SRC="$1"
OUT="$2"
JOBS="${3:-$(nproc)}"
CXX_BIN="$(command -v clang++ || true)"
if [ -z "$CXX_BIN" ]; then
  echo "sanitized_build: clang++ not found: skipping (apt-get install clang)"; exit 77
fi
if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' | \
     "$CXX_BIN" -x c++ -fsanitize=fuzzer,address - -o /tmp/flashq-libfuzzer-probe-$$ 2>/dev/null; then
  echo "sanitized_build: clang cannot link libFuzzer/ASan (libclang-rt-dev missing?): skipping"; exit 77
fi
rm -f /tmp/flashq-libfuzzer-probe-$$
# -O1 with line tables only: sanitizer reports keep file:line, the build stays cheaper than RelWithDebInfo.
cmake -S "$SRC" -B "$OUT" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -gline-tables-only" \
  -DCMAKE_C_FLAGS_RELEASE="-O1 -gline-tables-only" -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER="$CXX_BIN" -DFLASHQ_CUDA=OFF -DFLASHQ_SANITIZE=ON -DFLASHQ_FUZZ=ON >/dev/null
cmake --build "$OUT" -j"$JOBS" --target flashq-server flashq_request_fuzzer
echo "sanitized_build: $OUT/bin/flashq-server and $OUT/bin/flashq_request_fuzzer"
