#!/usr/bin/env bash
# The HTTP/2 balancing that deploy/k8s relies on, without a cluster: two CPU-image
# replicas started with the Deployment's own server flags, behind one DNS name with an
# A record per replica (podman's network DNS, as cluster DNS serves the headless
# Service), and a gRPC client balancing over that name (balancing_check.py). The
# Deployment's connection age (a minute) is shortened to AGE_MS so the test takes
# seconds; everything else is the manifest's.
#
#   tests/deploy/balancing_test.sh BUILD_DIR
#
# Needs root (rootful podman); exits 77 (ctest: skipped) otherwise.
set -euo pipefail
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="$(cd "${1:?usage: balancing_test.sh BUILD_DIR}" && pwd)"
AGE_MS=2000
TEST=balancing
. "$SRC/tests/deploy/podman_lib.sh"
podman_setup

WORK=$(mktemp -d "$BUILD/deploy-balancing.XXXXXX")
NET=flashq-balancing-$$
cleanup() {
  podman network rm -f "$NET" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

build_image deploy/Dockerfile.cpu flashq:cpu
RUN=(podman run -d --network "$NET")
cublaslt_mount
[ -z "$CUBLASLT_MOUNT" ] || RUN+=(-v "$CUBLASLT_MOUNT")
mapfile -t ARGS < <("$PY" - "$SRC/deploy/k8s/deployment.yaml" "$AGE_MS" <<'PY'
import sys, yaml
dep = yaml.safe_load(open(sys.argv[1]))
for a in dep["spec"]["template"]["spec"]["containers"][0]["args"]:
    print(f"--grpc-max-connection-age={sys.argv[2]}" if a.startswith("--grpc-max-connection-age=") else a)
PY
)
podman network create "$NET" >/dev/null
log "replicas: ${RUN[*]} flashq:cpu ${ARGS[*]}"
"$PY" "$SRC/tests/deploy/balancing_check.py" "$NET" flashq-headless "$AGE_MS" -- "${RUN[@]}" flashq:cpu "${ARGS[@]}" ||
  fail "client-side balancing over the headless name"
log "PASSED in $(elapsed "$t0") s"
