# Shared by the scripts in bench/gpu/ (sourced, not run): the output folder, the time budget, step
# results, the kernels-only build and the compute-sanitizer subsets.

# start_run BUDGET_S: OUT (default ./out) made absolute, logs in $LOGS, the clock started, step results reset.
start_run() {
  OUT=${OUT:-out}
  mkdir -p "$OUT/logs"
  OUT=$(cd "$OUT" && pwd)
  LOGS=$OUT/logs
  T0=$(date +%s)
  BUDGET=$1
  mkdir -p "$OUT/status"
  rm -f "$OUT"/status/*
}

JOBS=${FLASHQ_JOBS:-$(nproc)}
ARCHS=${FLASHQ_CUDA_ARCHS:-90a-real}
el() { echo $(( $(date +%s) - T0 )); }
left() { local l=$(( BUDGET - $(el) )); [ $l -gt 5 ] && echo $l || echo 5; }
cap() { local l=$(left); [ "$l" -lt "$1" ] && echo "$l" || echo "$1"; }  # the smaller of $1 and what is left

# Each step writes "<status> <seconds> <note>" to $OUT/status/<name>; summary() prints the table.
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
# summary TITLE STEP...: the table of the steps' results; FAILED counts the steps that did not pass.
summary() {
  local title=$1 s st secs note
  shift
  FAILED=0
  echo
  echo "== $title"
  printf '%-20s %-5s %6s  %s\n' check result secs note
  for s in "$@"; do
    if [ -f "$OUT/status/$s" ]; then
      read -r st secs note < "$OUT/status/$s"
    else
      st=FAIL secs=- note="did not report"
    fi
    [ "$st" = PASS ] || FAILED=$((FAILED + 1))
    printf '%-20s %-5s %6s  %s\n' "$s" "$st" "$secs" "${note:0:150}"
  done
}

# The tree, the bundle's commit and the GPU (its name first: results are named after it).
device_info() {
  echo "date: $(date -u +%FT%TZ)"
  echo "tree: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (modified)')"
  echo "bundle commit: $(cat .gpu/COMMIT 2>/dev/null || echo none)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>&1
}
require_gpu() {
  if ! nvidia-smi -L >/dev/null 2>&1; then
    echo "no GPU visible (nvidia-smi -L failed): nothing can be checked here"
    exit 77
  fi
}

# kernels_build LOG TARGET...: the kernels-only tree (no gRPC needed) in build-gpu.
kernels_build() {
  local log=$1
  shift
  cmake -S . -B build-gpu -G Ninja -DFLASHQ_KERNELS_ONLY=ON -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" > "$log" 2>&1 &&
    timeout "$(left)" cmake --build build-gpu -j"$JOBS" --target "$@" >> "$log" 2>&1
}

# san NAME TOOL BINARY FILTER: one compute-sanitizer run of a GoogleTest binary on a filter.
san() {
  local t=$(date +%s)
  timeout "$(left)" compute-sanitizer --tool "$2" --error-exitcode 9 "$3" --gtest_brief=1 \
    --gtest_filter="$4" > "$LOGS/$1.log" 2>&1
  local rc=$?
  # A filter that matches nothing passes vacuously: that is a failure here.
  if [ $rc = 0 ] && ! grep -qE "^\[  PASSED  \] [1-9]" "$LOGS/$1.log"; then rc=1; fi
  verdict "$1" $rc "$t" "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|^\[  PASSED' "$LOGS/$1.log" | tr '\n' ' ')"
}

# The sanitizer subsets: shapes that cover each kernel's paths (TMA and cp.async tiles, GQA, several
# splits, the ring refills of the gemm kernels) at sizes the tools finish in time.
SAN_ATTENTION='*bf16_hd128_causal_gqa4*:*bf16_hd64_full_gqa1*:*fp16_hd256_causal_gqa8*:*PagedGpuTest*bf16_hd128*page16_q3*:*PagedGpuTest*fp16_hd64*gqa4*:*PagedGpuTest*bf16_hd256*gqa8*:PagedGpu.*:-Long*'
# Racecheck exits 9 on the multi-threaded launch test with no hazard reported; memcheck covers it, and
# racecheck the same kernels in the single-thread cases (appended after -Long*, so it is excluded).
SAN_ATTENTION_RACE="$SAN_ATTENTION:PagedGpu.Concurrent*"
SAN_GEMM_MEMCHECK='Shapes/GemmGpuW4.*/1:Shapes/GemmGpuW4.*/4:Shapes/GemmGpuW4.*/6:Modes/GemmGpuFp8.*/0:Scales/*:GemmGpu.W4A16ShapeErrors*:GemmGpu.W4A16StagedKernelKeepsTheBits:GemmGpu.W8A16StagedKernelKeepsTheBits:GemmGpu.W4A16StripPairsKeepTheBits:GemmGpu.InvariantTilesAllGiveTheSameBits:GemmGpu.W16InvariantShapeErrors*'
# The steady-pass and resident-grid tests run wgmma blocks of more stages than the ring holds, so the
# ring's refills (bulk copies into slots that warps have read) are checked; the staged test, the small-M
# kernel whose weights and X arrive by bulk copies; the strip pairs, whose sums cross into the partner
# block's shared memory; every tile of the invariant GEMM (its K runs past the ring, so its slots are refilled).
SAN_GEMM_RACECHECK='Shapes/GemmGpuW4.*/4:GemmGpu.W4A16SteadyPassesKeepTheBits:GemmGpu.W4A16ResidentGridFallbacksKeepTheBits:GemmGpu.W4A16StagedKernelKeepsTheBits:GemmGpu.W8A16StagedKernelKeepsTheBits:GemmGpu.W4A16StripPairsKeepTheBits:GemmGpu.InvariantTilesAllGiveTheSameBits'
# The server's executor tests; the plain-reference scenarios repeat them at sizes too slow under memcheck.
SAN_SERVER='-Cuda/PlainReferenceTest.*'
