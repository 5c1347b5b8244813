#!/usr/bin/env bash
# The README's first command: installs what is missing, builds what the demo runs, starts
# flashq-server on the embedded demo models, puts load on it and prints a table of
# throughput and p50/p99 latency, headed by the backend and device that served it.
#
# It builds only flashq-server and flashq-bench, into their own folder (build-demo), for
# the hardware that is there, so that the first table comes in minutes:
#   no GPU visible      no CUDA compilation at all; the CPU backend
#   a GPU visible       CUDA kernels for that GPU's architecture only (nvidia-smi's
#                       compute_cap: 8.0 -> 80-real, 8.9 -> 89-real, 9.0 -> 90a-real; other
#                       8.x GPUs run sm_80 code); the CUDA backend
# scripts/build.sh still builds everything into build/ for sm_80, sm_89 and sm_90a.
#
# The load comes from flashq-bench (which spawns its own server), or with
# FLASHQ_DEMO_LOADER=perf_analyzer from perf_analyzer (from the tritonclient wheel) over
# `attention` and a linear layer, against a server this script starts.
#
#   scripts/demo.sh
#   scripts/demo.sh --dry-run         # say what would be built and run, do nothing
#   scripts/demo.sh --build-only      # set up and build, no server (e.g. binaries for another host)
#   FLASHQ_DEMO_GPU_ARCH=9.0 ...      # stands in for nvidia-smi's compute_cap (8.0, 89, 90a, ...;
#                                     # several GPUs: "8.0,8.0"; none: no GPU)
#   FLASHQ_CUDA_ARCHS="80-real 90a-real" ...  # build these architectures instead of the detected one
#   FLASHQ_CUDA=OFF ...               # CPU backend, no CUDA compilation, even with a GPU
#   BUILD_DIR=build-demo ...          # the demo's build folder
#   FLASHQ_DEMO_SECONDS=5 ...         # measurement window per point (perf_analyzer path)
#   FLASHQ_GRPC_PORT=8001 FLASHQ_METRICS_PORT=8002 ...
#   FLASHQ_DEMO_LOADER=perf_analyzer  # the perf_analyzer path
#   FLASHQ_NO_BUILD=1 FLASHQ_BIN_DIR=DIR  # skip setup and build, use binaries from DIR
#   scripts/demo.sh -- ARGS           # extra arguments go to flashq-bench (e.g. --scenarios=kv_decode,
#                                     # --server-backend=cpu), or to flashq-server on the
#                                     # perf_analyzer path
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
BUILD_DIR="${BUILD_DIR:-build-demo}"
DRY_RUN=0
BUILD_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1; shift ;;
    --build-only) BUILD_ONLY=1; shift ;;
    --) shift; break ;;
    *) break ;;
  esac
done

# ---- the hardware -----------------------------------------------------------------
# The SASS flashq ships for a compute capability. A cubin runs on GPUs of its major version
# with the same or a higher minor, so 8.6 and 8.7 run sm_80 code; 8.9 has its own (FP8).
arch_for_capability() {
  case "$1" in
    9.0) echo 90a-real ;;
    8.9) echo 89-real ;;
    8.*) echo 80-real ;;
    *) return 1 ;;
  esac
}
# "90a", "sm_89", "8.0" -> "9.0", "8.9", "8.0"
normalize_capability() {
  local c="${1#sm_}"
  c="${c%a}"
  if [[ $c =~ ^[0-9]+\.[0-9]+$ ]]; then echo "$c"
  elif [[ $c =~ ^([0-9]+)([0-9])$ ]]; then echo "${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"
  else return 1; fi
}

# GPU_CAPS: one compute capability per visible GPU ("?" where it cannot be read); GPU_NAMES.
GPU_CAPS=()
GPU_NAMES=""
GPU_SOURCE=""
if [ -n "${FLASHQ_DEMO_GPU_ARCH+set}" ]; then
  GPU_SOURCE="FLASHQ_DEMO_GPU_ARCH=$FLASHQ_DEMO_GPU_ARCH"
  if [ "$FLASHQ_DEMO_GPU_ARCH" != none ] && [ -n "$FLASHQ_DEMO_GPU_ARCH" ]; then
    for c in ${FLASHQ_DEMO_GPU_ARCH//,/ }; do
      n=$(normalize_capability "$c") || { echo "demo: FLASHQ_DEMO_GPU_ARCH: '$c' is not a compute capability (e.g. 9.0, 90a, none)"; exit 2; }
      GPU_CAPS+=("$n")
    done
  fi
elif command -v nvidia-smi >/dev/null 2>&1; then
  GPU_SOURCE="nvidia-smi"
  # No driver, or a driver with no GPU: nvidia-smi fails or lists nothing.
  if smi=$(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null); then
    while IFS= read -r l; do
      [ -n "$l" ] || continue
      n=$(normalize_capability "${l##*, }") || n="?"
      GPU_CAPS+=("$n")
      GPU_NAMES="${GPU_NAMES:+$GPU_NAMES, }${l%, *}"
    done <<<"$smi"
  elif smi=$(nvidia-smi -L 2>/dev/null) && [ -n "$smi" ]; then
    # A driver too old for the compute_cap field: GPUs are there, their architecture unknown.
    while IFS= read -r l; do [[ $l == GPU* ]] && GPU_CAPS+=("?"); done <<<"$smi"
  fi
else
  GPU_SOURCE="no nvidia-smi"
fi

# Where CMake looks for nvcc: CUDACXX, /usr/local/cuda, PATH.
NVCC=""
if [ -n "${CUDACXX:-}" ]; then NVCC=$(command -v "$CUDACXX" || true)
elif [ -x /usr/local/cuda/bin/nvcc ]; then NVCC=/usr/local/cuda/bin/nvcc
else NVCC=$(command -v nvcc || true); fi

# BACKEND, CUDA (ON/OFF) and ARCHS (for FLASHQ_CUDA_ARCHS) from the GPUs, nvcc and the knobs.
BACKEND=cpu
CUDA=OFF
ARCHS=""
if [ ${#GPU_CAPS[@]} -eq 0 ]; then
  WHY="no GPU visible ($GPU_SOURCE)"
else
  caps=$(IFS=,; echo "${GPU_CAPS[*]}")
  WHY="${#GPU_CAPS[@]} GPU(s) visible${GPU_NAMES:+ ($GPU_NAMES)}, compute capability ${caps//,/, } ($GPU_SOURCE)"
  unknown=0
  for c in "${GPU_CAPS[@]}"; do
    if [ "$c" = "?" ]; then unknown=1
    elif a=$(arch_for_capability "$c"); then [[ " $ARCHS " == *" $a "* ]] || ARCHS="${ARCHS:+$ARCHS }$a"
    else
      WHY="$WHY; flashq has no kernels for compute capability $c (sm_80, sm_89, sm_90a)"
      ARCHS=""; unknown=0; break
    fi
  done
  # Architecture unknown: every one flashq ships (slower to build, runs on any of them).
  (( unknown )) && ARCHS="80-real 89-real 90a-real"
  # Prebuilt binaries (FLASHQ_NO_BUILD) need no nvcc here.
  if [ -z "$ARCHS" ]; then :
  elif [ -z "$NVCC" ] && [ "${FLASHQ_NO_BUILD:-0}" != 1 ]; then WHY="$WHY; no nvcc (CUDACXX, /usr/local/cuda/bin or PATH), so no CUDA backend"
  else BACKEND=cuda; CUDA=ON; fi
fi
if [ -n "${FLASHQ_CUDA_ARCHS:-}" ] && [ "${FLASHQ_CUDA:-}" != OFF ]; then
  ARCHS="$FLASHQ_CUDA_ARCHS"; CUDA=ON; WHY="$WHY; FLASHQ_CUDA_ARCHS given"
fi
if [ "${FLASHQ_CUDA:-}" = OFF ]; then
  BACKEND=cpu; CUDA=OFF; ARCHS=""; WHY="$WHY; FLASHQ_CUDA=OFF"
fi
if [ "${FLASHQ_NO_BUILD:-0}" = 1 ]; then
  echo "demo: $WHY -> $BACKEND backend (binaries from ${FLASHQ_BIN_DIR:-$BUILD_DIR/bin})"
elif [ "$CUDA" = ON ]; then
  echo "demo: $WHY -> CUDA kernels for $ARCHS, $BACKEND backend"
else
  echo "demo: $WHY -> no CUDA compilation, cpu backend"
fi

# ---- setup and build ----------------------------------------------------------------
BUILD_ENV=(BUILD_DIR="$BUILD_DIR" FLASHQ_CUDA="$CUDA" FLASHQ_BUILD_PROGRESS=1)
[ "$CUDA" = ON ] && BUILD_ENV+=(FLASHQ_CUDA_ARCHS="$ARCHS")
BUILD_CMD=(scripts/build.sh -- --target flashq-server flashq-bench)
if [ "${FLASHQ_NO_BUILD:-0}" != 1 ]; then
  if [ "$DRY_RUN" = 1 ]; then
    echo "demo: would run scripts/setup.sh"
    echo "demo: would run $(printf '%q ' "${BUILD_ENV[@]}" "${BUILD_CMD[@]}")"
    env "${BUILD_ENV[@]}" FLASHQ_BUILD_DRY_RUN=1 "${BUILD_CMD[@]}"
  else
    scripts/setup.sh
    echo "demo: building flashq-server and flashq-bench into $BUILD_DIR (scripts/build.sh builds everything into build/)"
    env "${BUILD_ENV[@]}" "${BUILD_CMD[@]}"
  fi
fi
[ "$BUILD_ONLY" = 1 ] && [ "$DRY_RUN" != 1 ] && { echo "demo: built; run the demo with scripts/demo.sh"; exit 0; }

BIN="${FLASHQ_BIN_DIR:-$BUILD_DIR/bin}"
CACHE="${FLASHQ_DEMO_CACHE:-$ROOT/$BUILD_DIR/demo-cache}"

# "served by ..." from the server's log line "... models from ... on the <backend> backend".
served_by() {
  local b
  b=$(sed -n 's/^flashq-server: .* on the \(.*\) backend$/\1/p' "$1" 2>/dev/null | tail -n 1)
  if [ -z "$b" ]; then
    echo "demo: the server did not come up; the end of its log ($1):"
    tail -n 20 "$1" 2>/dev/null | sed 's/^/  /'
    return
  fi
  if [ "${b%% *}" = cpu ]; then
    local cpu
    cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
    echo "served by: flashq-server on the cpu backend (${cpu:-CPU}, $(nproc) cores)"
  else
    echo "served by: flashq-server on the ${b%% *} backend ${b#* }"
  fi
}

# flashq-bench where it is there (FLASHQ_BIN_DIR may hold only the server); else perf_analyzer.
if [ "${FLASHQ_DEMO_LOADER:-}" != perf_analyzer ] && { [ "$DRY_RUN" = 1 ] || [ -x "$BIN/flashq-bench" ]; }; then
  SERVER_LOG="$BUILD_DIR/demo-server.log"
  BENCH=("$BIN/flashq-bench" --spawn-server --server-binary="$BIN/flashq-server" --server-backend="$BACKEND"
         --server-log="$SERVER_LOG" --server-arg=--demo-cache-dir="$CACHE" "$@")
  if [ "$DRY_RUN" = 1 ]; then echo "demo: would run $(printf '%q ' "${BENCH[@]}")"; exit 0; fi
  mkdir -p "$CACHE"
  echo "demo: load from flashq-bench (it starts its own server; log: $SERVER_LOG)"
  # The table goes to stdout once the run ends: print it under the line that says what served.
  out=$(mktemp -t flashq-demo-table.XXXXXX)
  rc=0
  "${BENCH[@]}" >"$out" || rc=$?
  echo
  served_by "$SERVER_LOG"
  sed '1{/^$/d}' "$out"
  rm -f "$out"
  exit $rc
fi

# ---- perf_analyzer path -----------------------------------------------------------
free_port() { .venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port_busy() { .venv/bin/python -c "import socket,sys; s=socket.socket(); sys.exit(0 if s.connect_ex(('127.0.0.1',$1))==0 else 1)"; }
if [ "$DRY_RUN" = 1 ]; then
  echo "demo: would run $BIN/flashq-server --backend=$BACKEND --demo-cache-dir=$CACHE $* and perf_analyzer"
  exit 0
fi
mkdir -p "$CACHE"
GRPC_PORT="${FLASHQ_GRPC_PORT:-8001}"; METRICS_PORT="${FLASHQ_METRICS_PORT:-8002}"
port_busy "$GRPC_PORT" && GRPC_PORT=$(free_port)
port_busy "$METRICS_PORT" && METRICS_PORT=$(free_port)

WORK=$(mktemp -d /tmp/flashq-demo.XXXXXX)
LOG="$WORK/server.log"
echo "demo: starting $BIN/flashq-server on gRPC :$GRPC_PORT, metrics :$METRICS_PORT (log: $LOG)"
"$BIN/flashq-server" --grpc-port="$GRPC_PORT" --metrics-port="$METRICS_PORT" --host=127.0.0.1 \
  --backend="$BACKEND" --demo-cache-dir="$CACHE" "$@" 2>"$LOG" &
SERVER_PID=$!
cleanup() {
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID"; wait "$SERVER_PID" || echo "demo: server exited with $?"
  fi
}
trap cleanup EXIT

# The first start generates the demo repository (a few hundred MB of weights).
for i in $(seq 1 600); do
  grep -q "flashq-server ready" "$LOG" && break
  kill -0 "$SERVER_PID" 2>/dev/null || { echo "demo: server exited early:"; tail -30 "$LOG"; exit 1; }
  sleep 0.5
done
grep -q "flashq-server ready" "$LOG" || { echo "demo: server not ready after 300 s"; tail -30 "$LOG"; exit 1; }
echo "demo: server ready"

SECS="${FLASHQ_DEMO_SECONDS:-3}"
# Input data as JSON (base64 raw bytes): perf_analyzer cannot generate random BF16, and
# random INT32 would not be valid CU_SEQLENS (attention's optional inputs, for which it
# wants data). Attention requests carry two sequences of 96 and 160 tokens.
.venv/bin/python - "$WORK" <<'PY'
import base64, json, sys, numpy as np
work = sys.argv[1]
rng = np.random.default_rng(0)
def b64(a): return {"b64": base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()}
q = rng.standard_normal((256, 32, 128)).astype(np.float16)
kv = rng.standard_normal((256, 8, 128)).astype(np.float16)
json.dump({"data": [{"Q": {"content": b64(q), "shape": [256, 32, 128]},
                     "K": {"content": b64(kv), "shape": [256, 8, 128]},
                     "V": {"content": b64(kv), "shape": [256, 8, 128]},
                     "CU_SEQLENS_Q": {"content": [0, 96, 256], "shape": [3]},
                     "CU_SEQLENS_K": {"content": [0, 96, 256], "shape": [3]}}]},
          open(f"{work}/attention.json", "w"))
x = rng.standard_normal((16, 4096)).astype(np.float32)
bf16 = (x.view(np.uint32) >> 16).astype(np.uint16)
json.dump({"data": [{"X": {"content": b64(bf16), "shape": [16, 4096]}}]}, open(f"{work}/x_bf16.json", "w"))
json.dump({"data": [{"X": {"content": b64(x.astype(np.float16)), "shape": [16, 4096]}}]}, open(f"{work}/x_fp16.json", "w"))
PY
# The dtype the linear layer's config declares for X decides which file to use.
LINEAR="${FLASHQ_DEMO_LINEAR:-up_proj_bf16}"
X_DTYPE=$(.venv/bin/python - "$GRPC_PORT" "$LINEAR" <<'PY'
import sys, tritonclient.grpc as g
c = g.InferenceServerClient(f"127.0.0.1:{sys.argv[1]}")
m = c.get_model_metadata(sys.argv[2], as_json=True)
print(next(i["datatype"] for i in m["inputs"] if i["name"] == "X"))
PY
)
X_JSON="$WORK/x_fp16.json"; [ "$X_DTYPE" = BF16 ] && X_JSON="$WORK/x_bf16.json"

PA_COMMON=(-i grpc -u "127.0.0.1:$GRPC_PORT" --percentile 99 --max-trials 5
           --stability-percentage 50)
run_pa() {  # name csv args...
  local name=$1 csv=$2; shift 2
  echo "demo: perf_analyzer $name ..."
  scripts/perf_analyzer "${PA_COMMON[@]}" -f "$csv" "$@" > "$WORK/$name.txt" 2>&1 \
    || { echo "demo: perf_analyzer failed for $name:"; tail -20 "$WORK/$name.txt"; return 1; }
}
run_pa attention "$WORK/attention.csv" -m attention --input-data "$WORK/attention.json" --concurrency-range 1:4:3 \
  --measurement-interval $((SECS * 1000))
# A linear layer request takes a while on the CPU backend: count requests, not time.
run_pa "$LINEAR" "$WORK/linear.csv" -m "$LINEAR" --input-data "$X_JSON" --concurrency-range 1:2 \
  --measurement-mode count_windows --measurement-request-count "${FLASHQ_DEMO_LINEAR_REQUESTS:-8}"

echo
served_by "$LOG"
.venv/bin/python - "$WORK/attention.csv" "attention 2 seqs, 256 tokens, 32/8 heads" \
                   "$WORK/linear.csv" "$LINEAR X[16,4096] $X_DTYPE" <<'PY'
import csv, sys
rows = []
for path, label in zip(sys.argv[1::2], sys.argv[2::2]):
    for r in csv.DictReader(open(path)):
        rows.append((label, r["Concurrency"], float(r["Inferences/Second"]),
                     float(r["p50 latency"]) / 1000, float(r["p99 latency"]) / 1000))
w = max(len(r[0]) for r in rows)
print(f"{'model / request':<{w}}  {'clients':>7}  {'req/s':>9}  {'p50 ms':>8}  {'p99 ms':>8}")
print("-" * (w + 40))
for label, conc, thr, p50, p99 in rows:
    print(f"{label:<{w}}  {conc:>7}  {thr:>9.1f}  {p50:>8.2f}  {p99:>8.2f}")
print()
PY
echo "demo: server metrics at http://127.0.0.1:$METRICS_PORT/metrics; stopping the server"
