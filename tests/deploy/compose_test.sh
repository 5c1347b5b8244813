#!/usr/bin/env bash
# Brings up deploy/compose.yaml for real with podman-compose: flashq (the CPU image) and
# Prometheus (deploy/prometheus/Dockerfile: Debian's prometheus package on the same
# Debian 12 slim base), on the stack's own network, where Prometheus scrapes flashq:8002.
#
#   tests/deploy/compose_test.sh BUILD_DIR
#   FLASHQ_IMAGE_BUILD=full ...       the flashq image by the full multi-stage build
#
# Checks: flashq's healthcheck passes; inference through the published port (float64
# reference); Prometheus's flashq target is up and a histogram_quantile query over the
# stack answers, with the rule files loaded (stack_check.py); `podman-compose stop` ends
# both services with exit code 0. Grafana is not packaged in Debian and no registry is
# reachable here, so the grafana service is not started; check_deploy.py grafana checks
# its provisioning and dashboard.
# Needs root (rootful podman); exits 77 (ctest: skipped) otherwise.
set -euo pipefail
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="$(cd "${1:?usage: compose_test.sh BUILD_DIR}" && pwd)"
TEST=compose
. "$SRC/tests/deploy/podman_lib.sh"
podman_setup
COMPOSE="$SRC/.venv/bin/podman-compose"
[ -x "$COMPOSE" ] || fail "no $COMPOSE (scripts/setup.sh installs podman-compose into .venv)"

WORK=$(mktemp -d "$BUILD/deploy-compose.XXXXXX")
PROJECT=flashq-compose-test-$$
FILES=(-f "$SRC/deploy/compose.yaml")
compose() { "$COMPOSE" -p "$PROJECT" "${FILES[@]}" "$@"; }
cleanup() {
  compose down -v -t 5 >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# The images the stack runs, built here (podman-compose's own build passes neither
# --network=host, which apt in the Prometheus image needs, nor the bundle context).
build_image deploy/Dockerfile.cpu flashq:cpu
cublaslt_mount
if [ -n "$CUBLASLT_MOUNT" ]; then
  printf 'services:\n  flashq:\n    volumes:\n      - %s\n' "$CUBLASLT_MOUNT" >"$WORK/cublaslt.yaml"
  FILES+=(-f "$WORK/cublaslt.yaml")
fi
t=$(date +%s.%N)
podman build --format docker --network=host -t flashq-prometheus:debian12 "$SRC/deploy/prometheus" \
  >"$WORK/build-prometheus.log" 2>&1 || { tail -n 30 "$WORK/build-prometheus.log"; fail "building the Prometheus image failed"; }
log "built flashq-prometheus:debian12 (Debian's prometheus $(podman run --rm flashq-prometheus:debian12 --version 2>&1 | sed -n 's/^prometheus, version \([^ ]*\).*/\1/p')) in $(elapsed "$t") s"

read -r GRPC_PORT METRICS_PORT PROM_PORT < <(free_ports 3)
export FLASHQ_IMAGE=flashq:cpu PROMETHEUS_IMAGE=flashq-prometheus:debian12 FLASHQ_GRPC_HOST_PORT=$GRPC_PORT \
       FLASHQ_METRICS_HOST_PORT=$METRICS_PORT PROMETHEUS_HOST_PORT=$PROM_PORT
t=$(date +%s.%N)
compose up -d --no-build flashq prometheus >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; fail "podman-compose up failed"; }
service_container() {
  podman ps -a --filter "label=io.podman.compose.project=$PROJECT" --filter "label=com.docker.compose.service=$1" \
    --format '{{.Names}}' | head -n1
}
FLASHQ=$(service_container flashq) PROM=$(service_container prometheus)
[ -n "$FLASHQ" ] && [ -n "$PROM" ] || { cat "$WORK/up.log"; fail "podman-compose up did not create both services"; }
log "podman-compose -p $PROJECT -f deploy/compose.yaml up -d flashq prometheus: $FLASHQ, $PROM"
wait_healthy "$FLASHQ"
log "flashq healthy $(elapsed "$t") s after up"

"$PY" "$SRC/tests/deploy/infer_once.py" "127.0.0.1:$GRPC_PORT" "127.0.0.1:$METRICS_PORT" ||
  { podman logs "$FLASHQ" 2>&1 | tail -n 30; fail "inference or metrics through the published ports failed"; }
"$PY" "$SRC/tests/deploy/stack_check.py" "127.0.0.1:$GRPC_PORT" "http://127.0.0.1:$PROM_PORT" ||
  { podman logs "$PROM" 2>&1 | tail -n 30; fail "Prometheus over the stack"; }

t=$(date +%s.%N)
compose stop >"$WORK/stop.log" 2>&1 || { cat "$WORK/stop.log"; fail "podman-compose stop failed"; }
for c in "$FLASHQ" "$PROM"; do
  rc=$(podman inspect --format '{{.State.ExitCode}}' "$c")
  [ "$rc" = 0 ] || { podman logs "$c" 2>&1 | tail -n 20; fail "$c exit code $rc after podman-compose stop (expected 0)"; }
done
log "podman-compose stop: both services exited 0 in $(elapsed "$t") s"
log "PASSED in $(elapsed "$t0") s"
