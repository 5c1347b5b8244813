#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, starts flashq-server
# on the embedded demo models (CPU backend unless a GPU is present), puts load on it
# and prints a table of throughput and p50/p99 latency.
#
# The load comes from build/bin/flashq-bench (which spawns its own server) when it
# has been built; otherwise this script starts flashq-server and drives it with
# perf_analyzer (from the tritonclient wheel) over `attention` and a linear layer.
#
#   scripts/demo.sh
#   FLASHQ_DEMO_SECONDS=5 ...         # measurement window per point (perf_analyzer path)
#   FLASHQ_GRPC_PORT=8001 FLASHQ_METRICS_PORT=8002 ...
#   FLASHQ_DEMO_LOADER=perf_analyzer  # force the perf_analyzer path
#   FLASHQ_NO_BUILD=1 FLASHQ_BIN_DIR=DIR  # skip setup and build, use binaries from DIR
#   scripts/demo.sh -- ARGS           # extra arguments go to flashq-bench (e.g. --scenarios=kv_decode,
#                                     # --server-arg=--backend=cpu), or to flashq-server on the
#                                     # perf_analyzer path
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
BUILD_DIR="${BUILD_DIR:-build}"
[ "${1:-}" = "--" ] && shift

if [ "${FLASHQ_NO_BUILD:-0}" != 1 ]; then
  scripts/setup.sh
  scripts/build.sh
fi

BIN="${FLASHQ_BIN_DIR:-$BUILD_DIR/bin}"
CACHE="${FLASHQ_DEMO_CACHE:-$ROOT/$BUILD_DIR/demo-cache}"
mkdir -p "$CACHE"

if [ -x "$BIN/flashq-bench" ] && [ "${FLASHQ_DEMO_LOADER:-}" != perf_analyzer ]; then
  echo "demo: load from flashq-bench (it starts its own server)"
  exec "$BIN/flashq-bench" --spawn-server --server-binary="$BIN/flashq-server" \
    --server-arg=--demo-cache-dir="$CACHE" "$@"
fi

# ---- perf_analyzer path -----------------------------------------------------------
free_port() { .venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
port_busy() { .venv/bin/python -c "import socket,sys; s=socket.socket(); sys.exit(0 if s.connect_ex(('127.0.0.1',$1))==0 else 1)"; }
GRPC_PORT="${FLASHQ_GRPC_PORT:-8001}"; METRICS_PORT="${FLASHQ_METRICS_PORT:-8002}"
port_busy "$GRPC_PORT" && GRPC_PORT=$(free_port)
port_busy "$METRICS_PORT" && METRICS_PORT=$(free_port)

WORK=$(mktemp -d /tmp/flashq-demo.XXXXXX)
LOG="$WORK/server.log"
echo "demo: starting $BIN/flashq-server on gRPC :$GRPC_PORT, metrics :$METRICS_PORT (log: $LOG)"
"$BIN/flashq-server" --grpc-port="$GRPC_PORT" --metrics-port="$METRICS_PORT" --host=127.0.0.1 \
  --demo-cache-dir="$CACHE" "$@" 2>"$LOG" &
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

.venv/bin/python - "$WORK/attention.csv" "attention 2 seqs, 256 tokens, 32/8 heads" \
                   "$WORK/linear.csv" "$LINEAR X[16,4096] $X_DTYPE" <<'PY'
import csv, sys
rows = []
for path, label in zip(sys.argv[1::2], sys.argv[2::2]):
    for r in csv.DictReader(open(path)):
        rows.append((label, r["Concurrency"], float(r["Inferences/Second"]),
                     float(r["p50 latency"]) / 1000, float(r["p99 latency"]) / 1000))
w = max(len(r[0]) for r in rows)
print()
print(f"{'model / request':<{w}}  {'clients':>7}  {'req/s':>9}  {'p50 ms':>8}  {'p99 ms':>8}")
print("-" * (w + 40))
for label, conc, thr, p50, p99 in rows:
    print(f"{label:<{w}}  {conc:>7}  {thr:>9.1f}  {p50:>8.2f}  {p99:>8.2f}")
print()
PY
echo "demo: server metrics at http://127.0.0.1:$METRICS_PORT/metrics; stopping the server"
