# shellcheck shell=bash
# Sourced by the container tests (tests/deploy/*_test.sh that run podman): podman as root with
# tests/deploy/containers.conf, Debian 12 base images made from the debootstrapped root
# that the bundle test caches (no registry is needed), and the flashq images.
#
# FLASHQ_IMAGE_BUILD picks how a flashq image is built:
#   prebuilt (default)  target `prebuilt`: the runtime stage around this build folder's
#                       bundle (deploy/bundle.sh), so nothing is compiled again;
#   full                the whole multi-stage build: setup.sh, build.sh and bundle.sh
#                       inside the builder stage (Debian packages and PyPI over the network).
# Callers set SRC, BUILD and TEST (the prefix of their log lines) before sourcing, and
# WORK (their scratch folder) before building.

PY="$SRC/.venv/bin/python"
t0=$(date +%s.%N)  # the test's start, for its PASSED line
log() { echo "$TEST: $*"; }
skip() { log "SKIPPED: $*"; exit 77; }
fail() { log "FAILED: $*"; exit 1; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[1]) - float(sys.argv[2]):.1f}')" "$(date +%s.%N)" "$1"; }

podman_setup() {
  [ "$(id -u)" = 0 ] || skip "needs root: podman runs rootful here (CI runs as root)"
  local tool
  for tool in podman runc; do
    command -v "$tool" >/dev/null || fail "$tool not installed (scripts/setup.sh installs it)"
  done
  "$PY" -c 'import tritonclient.grpc, numpy, yaml' 2>/dev/null ||
    fail "$PY lacks tritonclient[grpc], numpy or yaml (run scripts/setup.sh)"
  export CONTAINERS_CONF="$SRC/tests/deploy/containers.conf"
  CACHE=${FLASHQ_DEPLOY_CACHE:-$BUILD/deploy-cache}
  mkdir -p "$CACHE"
  # The Debian base images: those present are used (the official ones, where a registry
  # gave them); otherwise the minbase root the bundle test starts the server in, imported.
  if ! podman image exists debian:12-slim || ! podman image exists debian:12; then
    local t root_tar
    t=$(date +%s.%N)
    root_tar=$("$SRC/tests/deploy/debian_root.sh" "$CACHE")
    podman import -q --change 'CMD ["/bin/bash"]' "$root_tar" localhost/debian:12-slim >/dev/null
    podman tag localhost/debian:12-slim localhost/debian:12
    log "imported $(basename "$root_tar") as debian:12-slim and debian:12 in $(elapsed "$t") s"
  fi
}

# Unpacks this build folder's bundle into $WORK/bundle (once); sets BUNDLE_NEEDS_CUBLASLT.
make_bundle() {
  if [ ! -d "$WORK/bundle" ]; then
    local tarball
    tarball=$("$SRC/deploy/bundle.sh" --build-dir "$BUILD" --out-dir "$WORK")
    mkdir -p "$WORK/bundle"
    tar -C "$WORK/bundle" --strip-components=1 -xzf "$tarball"
  fi
  BUNDLE_NEEDS_CUBLASLT=$(. "$WORK/bundle/share/flashq/bundle.env"; echo "$FLASHQ_BUNDLE_NEEDS_CUBLASLT")
}

# The CPU image carries no cuBLASLt. Made around a CUDA-linked bundle (CI's build is one),
# it gets this host's, read-only, where GPU hosts keep it: sets CUBLASLT_MOUNT to a
# `podman run -v` argument, or to nothing.
cublaslt_mount() {
  CUBLASLT_MOUNT=
  [ "${FLASHQ_IMAGE_BUILD:-prebuilt}" = prebuilt ] || return 0
  make_bundle
  [ "$BUNDLE_NEEDS_CUBLASLT" = 1 ] || return 0
  local lt
  lt=$(ldconfig -p | sed -n 's/^[[:space:]]*libcublasLt\.so\.13 .*=> //p' | head -n1)
  [ -n "$lt" ] || lt=/usr/local/cuda/lib64/libcublasLt.so.13
  [ -e "$lt" ] || fail "CUDA-linked build, but this host has no libcublasLt.so.13 to lend the container"
  CUBLASLT_MOUNT="$(dirname "$(readlink -f "$lt")"):/usr/local/cuda/lib64:ro"
  log "CUDA-linked build: lending the host's cuBLASLt folder read-only: $CUBLASLT_MOUNT"
}

# build_image DOCKERFILE TAG: builds the flashq image DOCKERFILE (deploy/Dockerfile.cpu or
# deploy/Dockerfile) as FLASHQ_IMAGE_BUILD says.
build_image() {
  local dockerfile=$1 tag=$2 t ca
  # docker format: the OCI format has no HEALTHCHECK.
  local args=(--format docker --network=host -f "$SRC/$dockerfile" -t "$tag")
  # pip in a build (the builder's setup.sh, the GPU image's CUDA wheels) needs this
  # machine's CA trust: passed as a build secret, never stored in a layer.
  ca=${PIP_CERT:-${SSL_CERT_FILE:-$("$PY" -m pip config get global.cert 2>/dev/null || true)}}
  [ -s "$ca" ] && args+=(--secret "id=ca,src=$ca")
  case "${FLASHQ_IMAGE_BUILD:-prebuilt}" in
    prebuilt)
      make_bundle
      args+=(--target prebuilt --build-context "bundle=$WORK/bundle") ;;
    full) ;;
    *) fail "FLASHQ_IMAGE_BUILD=${FLASHQ_IMAGE_BUILD} (want prebuilt or full)" ;;
  esac
  t=$(date +%s.%N)
  log "podman build ${args[*]} $SRC"
  podman build "${args[@]}" "$SRC" >"$WORK/build-$(basename "$dockerfile").log" 2>&1 ||
    { tail -n 40 "$WORK/build-$(basename "$dockerfile").log"; fail "podman build of $dockerfile failed"; }
  log "built $tag (${FLASHQ_IMAGE_BUILD:-prebuilt}) from $dockerfile in $(elapsed "$t") s, $(podman image inspect --format '{{.Size}}' "$tag" | numfmt --to=iec) "
}

free_ports() {  # N: N free TCP ports on this host, space-separated
  "$PY" - "$1" <<'PY'
import socket, sys
ss = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in ss: s.bind(("", 0))
print(*[s.getsockname()[1] for s in ss])
PY
}

# wait_healthy CONTAINER: runs the image's HEALTHCHECK (podman healthcheck run; without
# systemd podman has no timer to run it on its own) until it passes, up to 300 s.
wait_healthy() {
  local _
  for _ in $(seq 1 300); do
    [ "$(podman inspect --format '{{.State.Running}}' "$1")" = true ] ||
      { podman logs "$1" 2>&1 | tail -n 30; fail "container $1 exited before it became healthy"; }
    podman healthcheck run "$1" >/dev/null 2>&1 && return 0
    sleep 1
  done
  podman logs "$1" 2>&1 | tail -n 30
  fail "container $1 not healthy within 300 s"
}
