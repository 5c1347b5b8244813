#!/usr/bin/env bash
# The CUDA backend end to end in one run on a host with a GPU: GPU tests through the server's
# executors and the kernel GPU tests directly, fatbin contents, cold start with JIT disabled and
# eager module loading, and the end-to-end scenarios. Prepare with bench/gpu/prepare.sh on the
# build host, then run `bench/gpu/e2e.sh` on the GPU host with .gpu beside the tree.
# Results land in $OUT (JSON + markdown); a short table is printed last. Exits non-zero if a test,
# the sanitizer, a cold start, a load run or a server's clean exit on SIGTERM failed.
# (bench/gpu/tests.sh is the verdict over every GPU test; this script is for the measurements.)
# PARTS picks sections (default all: tests,cold,e2e,multi,scale); E2E_SCENARIOS, E2E_CONC, E2E_SERVER_ARGS
# (extra server flags) and E2E_BENCH_ARGS (extra flashq-bench flags, e.g. --shared-memory=system)
# shape the end-to-end part. SCALE_SCENARIOS and SCALE_CONC shape the scaling part (the same load on
# GPU 0 alone, then on every GPU, and their ratio). E2E_SERVER_CPUS and E2E_CLIENT_CPUS (taskset CPU
# lists, e.g. 0-23 and 24-31) pin the server and the load generator to disjoint cores in every part,
# so that a host shared by both measures the server's side of it.
set -uo pipefail
FAILS=()
check() { [ "$2" = 0 ] || FAILS+=("$1 (exit $2)"); }
OUT=${OUT:-/tmp/flashq-gpu-out}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
. bench/gpu/lib.sh
tar xzf "$ROOT"/.gpu/flashq-bundle-*.tar.gz -C /tmp
B=$(ls -d /tmp/flashq-bundle-* | head -n1)
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export CUDA_DISABLE_PTX_JIT=1 CUDA_MODULE_LOADING=EAGER
CACHE=/tmp/flashq-demo
device_info | tee "$OUT/device.txt"

echo "== fatbin contents (cuobjdump)"
{ cuobjdump --list-elf "$B/libexec/flashq-server" | sed 's/.*\.\(sm_[0-9a-z]*\)\..*/\1/' | sort | uniq -c
  echo "ptx entries: $(cuobjdump --list-ptx "$B/libexec/flashq-server" 2>/dev/null | wc -l)"; } | tee "$OUT/cuobjdump.txt"

GPUS=$(nvidia-smi -L | wc -l)
PARTS=${PARTS:-tests,cold,e2e,multi,scale}
part() { [[ ",$PARTS," == *",$1,"* ]]; }
if part tests; then
echo "== GPU tests through the server's executors ($GPUS GPUs visible), then under compute-sanitizer memcheck"
"$ROOT"/.gpu/bin/flashq_server_gpu_tests --gtest_brief=1 2>&1 | tail -n 15 | tee "$OUT/server_gpu_tests.txt"
check "server GPU tests" "${PIPESTATUS[0]}"
timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 "$ROOT"/.gpu/bin/flashq_server_gpu_tests --gtest_brief=1 \
  --gtest_filter="$SAN_SERVER" 2>&1 | grep -E "ERROR SUMMARY|PASSED|FAILED" | tee -a "$OUT/server_gpu_tests.txt"
check "server GPU tests under memcheck" "${PIPESTATUS[0]}"
echo "== kernel GPU tests, directly"
for t in attention_gpu_test gemm_gpu_test; do
  [ -x "$ROOT/.gpu/bin/$t" ] || continue
  timeout 240 "$ROOT/.gpu/bin/$t" --gtest_brief=1 2>&1 | tail -n 3 | sed "s/^/$t: /" | tee -a "$OUT/server_gpu_tests.txt"
  check "$t" "${PIPESTATUS[0]}"
done
fi
# Cold start and the single-GPU scenarios run on GPU 0 alone; the several-GPU scenarios follow.
export CUDA_VISIBLE_DEVICES=0

echo "== demo repository (generated once, not timed)"
timeout 300 "$ROOT"/.gpu/bin/flashq-coldstart --server-binary="$B/libexec/flashq-server" --backend=cuda \
  --server-arg=--demo-cache-dir=$CACHE --steady=5 --log="$OUT/server-first.log" > /dev/null
check "demo repository generation" $?
if part cold; then
echo "== cold start (JIT disabled): module loading eager / lazy, fresh connection / warmed connection"
i=0
for cfg in EAGER: EAGER: LAZY: LAZY: EAGER:--warm-connection LAZY:--warm-connection; do
  i=$((i + 1))
  export CUDA_MODULE_LOADING=${cfg%%:*}
  echo "-- run $i: CUDA_MODULE_LOADING=$CUDA_MODULE_LOADING ${cfg#*:}"
  timeout 300 "$ROOT"/.gpu/bin/flashq-coldstart --server-binary="$B/libexec/flashq-server" --backend=cuda \
    --server-arg=--demo-cache-dir=$CACHE --steady=100 --log="$OUT/server-cold$i.log" ${cfg#*:} | tee "$OUT/coldstart$i.json"
  check "cold start run $i" "${PIPESTATUS[0]}"
  grep -E "backend up at|loaded and warmed|ready in" "$OUT/server-cold$i.log"
done
export CUDA_MODULE_LOADING=EAGER
fi

# serve_and_load NAME PORT WORKERS SCENARIOS CONCURRENCIES: a server on the demo models, gpu_e2e.py against it,
# then SIGTERM (the exit status shows a clean drain); tables land in $OUT/NAME.{json,md}.
serve_and_load() {
  local name=$1 port=$2
  ${E2E_SERVER_CPUS:+taskset -c "$E2E_SERVER_CPUS"} "$B/libexec/flashq-server" --backend=cuda --demo-cache-dir=$CACHE --grpc-port=$port --metrics-port=$((port + 1)) --http-port=0 \
    --kv-cache-blocks=40000 --gpu-arena-mb=12288 --workers-per-model=$3 ${E2E_SERVER_ARGS:-} > "$OUT/server-$name.log" 2>&1 &
  local spid=$!
  for _ in $(seq 1 240); do grep -q "flashq-server ready" "$OUT/server-$name.log" && break; sleep 0.5; done
  timeout 420 ${E2E_CLIENT_CPUS:+taskset -c "$E2E_CLIENT_CPUS"} python3 "$ROOT"/bench/e2e/gpu_e2e.py --bench="$B/libexec/flashq-bench" --endpoint=localhost:$port \
    --metrics=http://localhost:$((port + 1))/metrics --out-dir="$OUT/$name" --max-time=5 --scenarios="$4" \
    --concurrency="$5" --bench-args="${E2E_BENCH_ARGS:-}" | tail -n 20
  check "load run $name" "${PIPESTATUS[0]}"
  kill -TERM $spid; wait $spid
  local code=$?
  echo "server exit status: $code" | tee -a "$OUT/server-$name.log"
  check "server exit on SIGTERM ($name)" $code
  cp "$OUT/$name/e2e.json" "$OUT/$name.json"; cp "$OUT/$name/e2e.md" "$OUT/$name.md"
}
if part e2e; then
  echo "== end-to-end scenarios"
  serve_and_load e2e 18001 2 "${E2E_SCENARIOS:-a_kv_decode,b_attention_ragged,c_linear_w4a16,d_linear_bf16}" "${E2E_CONC:-1,16,64,256}"
fi
unset CUDA_VISIBLE_DEVICES
if part multi && [ "$GPUS" -ge 2 ]; then
  echo "== several GPUs: one worker per GPU, sessions pinned by sequence id, stateless work round-robin"
  serve_and_load e2e-multi 18011 4 a_kv_decode,c_linear_w4a16 64,256
fi
if part scale && [ "$GPUS" -ge 2 ]; then
  echo "== scaling: the same load and server flags on GPU 0 alone, then on all $GPUS GPUs"
  SCALE=(4 "${SCALE_SCENARIOS:-a_kv_decode,c_linear_w4a16}" "${SCALE_CONC:-256}")
  CUDA_VISIBLE_DEVICES=0 serve_and_load scale-one 18021 "${SCALE[@]}"
  serve_and_load scale-all 18031 "${SCALE[@]}"
  python3 "$ROOT"/bench/e2e/scaling.py "$OUT/scale-one.json" "$OUT/scale-all.json" "$GPUS" | tee "$OUT/scale.md"
  check "scaling report" "${PIPESTATUS[0]}"
fi
echo "== summary"
cat "$OUT/device.txt" "$OUT/server_gpu_tests.txt" | tail -n 8
cat "$OUT"/coldstart*.json 2>/dev/null
cat "$OUT"/e2e.md 2>/dev/null
[ -f "$OUT"/e2e-multi.md ] && cat "$OUT"/e2e-multi.md
[ -f "$OUT"/scale.md ] && cat "$OUT"/scale.md
# Keep the summaries at the top of $OUT and pack the rest into one archive.
(cd "$OUT" && tar czf logs.tgz --remove-files e2e e2e-multi scale-one scale-all server-*.log coldstart*.json cuobjdump.txt 2>/dev/null)
ls "$OUT"
if [ ${#FAILS[@]} -gt 0 ]; then
  printf 'FAILED: %s\n' "${FAILS[@]}"
  exit 1
fi
echo "PASSED: every test, sanitizer run, cold start and load run of this script"
