#!/usr/bin/env bash
# Builds a flashq image with podman and runs it as it ships: the image's own entrypoint,
# user (10001) and HEALTHCHECK, the demo repository generated in its volume.
#
#   tests/deploy/image_test.sh BUILD_DIR cpu     deploy/Dockerfile.cpu
#   tests/deploy/image_test.sh BUILD_DIR gpu     deploy/Dockerfile (needs a CUDA-linked build)
#   FLASHQ_IMAGE_BUILD=full ...                  the full multi-stage build (podman_lib.sh)
#
# Checks: the HEALTHCHECK passes (podman healthcheck run); one `attention` inference
# through the published gRPC port with tritonclient, checked against a float64
# reference; /metrics through the published port counted it; `podman stop` under load
# (stop_under_load.py): every request answered, those in flight answered OK; exit code 0.
# The GPU image runs here on the CPU backend (no GPU): that proves its libraries,
# cuBLASLt included, and everything but the CUDA backend itself.
# Needs root (rootful podman); exits 77 (ctest: skipped) otherwise.
set -euo pipefail
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="$(cd "${1:?usage: image_test.sh BUILD_DIR cpu|gpu}" && pwd)"
KIND=${2:?usage: image_test.sh BUILD_DIR cpu|gpu}
TEST=image-$KIND
. "$SRC/tests/deploy/podman_lib.sh"
podman_setup

WORK=$(mktemp -d "$BUILD/deploy-image.XXXXXX")
NAME=flashq-image-test-$KIND-$$
cleanup() {
  podman rm -f -v "$NAME" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

RUN_ARGS=()
case $KIND in
  cpu)
    DOCKERFILE=deploy/Dockerfile.cpu TAG=flashq:cpu
    cublaslt_mount
    [ -z "$CUBLASLT_MOUNT" ] || RUN_ARGS+=(-v "$CUBLASLT_MOUNT") ;;
  gpu)
    DOCKERFILE=deploy/Dockerfile TAG=flashq:gpu
    if [ "${FLASHQ_IMAGE_BUILD:-prebuilt}" = prebuilt ]; then
      make_bundle
      [ "$BUNDLE_NEEDS_CUBLASLT" = 1 ] ||
        skip "$BUILD is built without CUDA; the GPU image needs a CUDA-linked bundle (FLASHQ_CUDA=ON where nvcc exists)"
    fi ;;
  *) fail "kind $KIND: want cpu or gpu" ;;
esac
build_image "$DOCKERFILE" "$TAG"
[ "$(podman image inspect --format '{{.Config.User}}' "$TAG")" = 10001:10001 ] || fail "$TAG does not run as user 10001"

read -r GRPC_PORT METRICS_PORT < <(free_ports 2)
t=$(date +%s.%N)
podman run -d --name "$NAME" -p "$GRPC_PORT:8001" -p "$METRICS_PORT:8002" "${RUN_ARGS[@]}" "$TAG" >/dev/null 2>"$WORK/run.err" ||
  { cat "$WORK/run.err"; fail "podman run $TAG failed"; }
log "podman run -d -p $GRPC_PORT:8001 -p $METRICS_PORT:8002 ${RUN_ARGS[*]} $TAG"
wait_healthy "$NAME"
log "HEALTHCHECK passed $(elapsed "$t") s after podman run ($(podman logs "$NAME" 2>&1 | grep -o 'ready in [0-9.]* s' || true)); user $(podman exec "$NAME" id -u)"
# (Logs captured first: `podman logs | grep -q` fails under pipefail when grep exits early.)
logs=$(podman logs "$NAME" 2>&1)
grep -q "on the cpu backend" <<<"$logs" || { tail -n 20 <<<"$logs"; fail "the server did not start on the CPU backend"; }
log "launcher: $(podman exec "$NAME" /opt/flashq/bin/flashq env | grep cuBLASLt)"

"$PY" "$SRC/tests/deploy/infer_once.py" "127.0.0.1:$GRPC_PORT" "127.0.0.1:$METRICS_PORT" ||
  { podman logs "$NAME" 2>&1 | tail -n 30; fail "inference or metrics through the published ports failed"; }

"$PY" "$SRC/tests/deploy/stop_under_load.py" "127.0.0.1:$GRPC_PORT" -- podman stop -t 30 "$NAME" ||
  { podman logs "$NAME" 2>&1 | tail -n 30; fail "podman stop under load lost or broke requests"; }
rc=$(podman inspect --format '{{.State.ExitCode}}' "$NAME")
[ "$rc" = 0 ] || { podman logs "$NAME" 2>&1 | tail -n 20; fail "exit code $rc after podman stop (expected 0)"; }
logs=$(podman logs "$NAME" 2>&1)
grep -q 'flashq-server: stopped' <<<"$logs" || { tail -n 20 <<<"$logs"; fail "the server did not drain and stop"; }
log "podman stop: exit code 0, drained"
podman image prune -f --filter "label=org.opencontainers.image.title=$(podman image inspect --format '{{index .Labels "org.opencontainers.image.title"}}' "$TAG")" >/dev/null
log "PASSED in $(elapsed "$t0") s"
