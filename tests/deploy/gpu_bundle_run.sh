#!/usr/bin/env bash
# Runs a CUDA bundle on a host with a GPU (the same artefact as the CPU deployment):
# unpacks it, prints what the launcher found (the host's cuBLASLt), starts the server
# with --backend=cuda, waits for gRPC SERVING with the bundled flashq-health, drives
# the bundled flashq-bench for a few seconds, checks /metrics (GPU families included),
# and stops the server with SIGTERM. Writes logs to $OUT (or ./gpu-bundle-out).
#
#   tests/deploy/gpu_bundle_run.sh path/to/flashq-bundle-*.tar.gz
set -euo pipefail
TARBALL=$(readlink -f "${1:?usage: gpu_bundle_run.sh BUNDLE.tar.gz}")
OUT=${OUT:-$PWD/gpu-bundle-out}
mkdir -p "$OUT"
DIR=$(mktemp -d)
trap 'kill -KILL $PID 2>/dev/null || true; rm -rf "$DIR"' EXIT
PID=
log() { echo "gpu-bundle: $*" | tee -a "$OUT/summary.txt"; }
tar -C "$DIR" -xzf "$TARBALL"
B=$(echo "$DIR"/flashq-bundle-*)
log "host: $(. /etc/os-release; echo "$PRETTY_NAME"), $(ldd --version | head -n1)"
log "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1)"
"$B/bin/flashq" env | tee -a "$OUT/summary.txt"
grep -E '^(version|commit|flavour):' "$B/share/flashq/MANIFEST" | tee -a "$OUT/summary.txt"
t0=$(date +%s.%N)
"$B/bin/flashq" --backend=cuda --host=127.0.0.1 --grpc-port=18001 --metrics-port=18002 --http-port=0 \
  --demo-cache-dir="$DIR/demo" >"$OUT/server.log" 2>&1 &
PID=$!
"$B/bin/flashq-health" --addr 127.0.0.1:18001 --wait-s 300 --timeout-ms 1000 || { tail -n 30 "$OUT/server.log"; exit 1; }
log "SERVING after $(python3 -c "import time,sys; print(f'{time.time()-float(sys.argv[1]):.1f}')" "$t0") s; $(grep -o 'ready in.*' "$OUT/server.log" || true)"
grep -i 'cuda\|gpu\|backend' "$OUT/server.log" | head -n 5 | tee -a "$OUT/summary.txt" || true
"$B/bin/flashq-bench" --endpoints 127.0.0.1:18001 --model attention --concurrency 1,16 --max-time 4 \
  --output-dir "$OUT/bench" --no-plot --progress off 2>&1 | tail -n 15 | tee -a "$OUT/summary.txt"
curl -fsS http://127.0.0.1:18002/metrics >"$OUT/metrics.txt" || python3 -c \
  "import urllib.request; open('$OUT/metrics.txt','wb').write(urllib.request.urlopen('http://127.0.0.1:18002/metrics').read())"
log "metrics families: $(grep -c '^# TYPE flashq_' "$OUT/metrics.txt"); $(grep -E '^flashq_gpu_memory_used_bytes' "$OUT/metrics.txt" | head -n 2 | tr '\n' ' ')"
kill -TERM $PID; rc=0; wait $PID || rc=$?; PID=
log "server exit code after SIGTERM: $rc"
tail -n 3 "$OUT/server.log" | tee -a "$OUT/summary.txt"
