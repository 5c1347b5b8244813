#!/usr/bin/env bash
# Proves the relocatable bundle carries everything it needs: packs BUILD_DIR with
# deploy/bundle.sh, unpacks it into a fresh minimal Debian 12 root (debootstrap
# --variant=minbase: no compiler, no -dev packages, no gRPC/protobuf/abseil), starts
# the server there under chroot with the CPU backend, and from outside checks gRPC
# health (flashq-health), runs one `attention` inference with tritonclient (result
# checked against numpy), reads /metrics, then stops the server with SIGTERM.
#
#   tests/deploy/bundle_chroot_test.sh BUILD_DIR
#
# Needs root (debootstrap, chroot, mount); exits 77 (ctest: skipped) otherwise.
# The debootstrapped root is cached as BUILD_DIR/deploy-cache/bookworm-minbase.tar
# (or $FLASHQ_DEPLOY_CACHE/bookworm-minbase.tar)
# (about 35-60 s once); each run unpacks a fresh copy (a few seconds).
# When the server is built with CUDA it needs the host's libcublasLt.so.13, which the
# bundle never carries: the test then bind-mounts (read-only, in a private mount
# namespace) the host's folder holding it at /usr/local/cuda/lib64 inside the root,
# which is where our GPU hosts have it, so the launcher's search is exercised too.
set -euo pipefail
SRC="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="$(cd "${1:?usage: bundle_chroot_test.sh BUILD_DIR}" && pwd)"
log() { echo "bundle-chroot: $*"; }
skip() { log "SKIPPED: $*"; exit 77; }
fail() { log "FAILED: $*"; exit 1; }
t0=$(date +%s.%N)
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[1]) - float(sys.argv[2]):.1f}')" "$(date +%s.%N)" "$1"; }

[ "$(id -u)" = 0 ] || skip "needs root for debootstrap/chroot/mount (CI runs as root)"
for tool in debootstrap chroot unshare mount; do
  command -v "$tool" >/dev/null || skip "$tool not installed (scripts/setup.sh installs debootstrap)"
done
[ -x "$BUILD/bin/flashq-server" ] || fail "no $BUILD/bin/flashq-server"
[ -x "$BUILD/bin/flashq-health" ] || fail "no $BUILD/bin/flashq-health"
PY="$SRC/.venv/bin/python"
"$PY" -c 'import tritonclient.grpc, numpy' 2>/dev/null || fail "$PY lacks tritonclient[grpc]/numpy (run scripts/setup.sh)"

# FLASHQ_DEPLOY_CACHE moves the cached root elsewhere (e.g. to outlive fresh CI clones).
CACHE=${FLASHQ_DEPLOY_CACHE:-$BUILD/deploy-cache}
mkdir -p "$CACHE"
WORK=$(mktemp -d "$BUILD/deploy-run.XXXXXX")
ROOTFS="$WORK/root"
SERVER_PID=
cleanup() {
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then kill -KILL "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  # Mounts live only in the server's private namespace, so nothing is mounted here;
  # refuse to delete if something is (it would reach the host's files).
  if grep -q " $WORK/" /proc/self/mounts; then log "mounts left under $WORK; not deleting it"; return; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# 1. A clean Debian 12 root.
t=$(date +%s.%N)
ROOT_TAR=$("$SRC/tests/deploy/debian_root.sh" "$CACHE")
mkdir -p "$ROOTFS"
tar -C "$ROOTFS" -xf "$ROOT_TAR"
log "clean root ready in $(elapsed "$t") s ($(du -sh "$ROOTFS" | cut -f1)): $(. "$ROOTFS/etc/os-release"; echo "$PRETTY_NAME")"
# It really is clean: no gRPC/protobuf/abseil and no -dev packages.
if ls "$ROOTFS"/usr/lib/*/libgrpc* "$ROOTFS"/usr/lib/*/libprotobuf* "$ROOTFS"/usr/lib/*/libabsl* >/dev/null 2>&1; then
  fail "the root already has gRPC/protobuf/abseil libraries"
fi
devs=$(chroot "$ROOTFS" dpkg-query -W -f '${Package}\n' | grep -- '-dev$' || true)
[ -z "$devs" ] || fail "the root has -dev packages: $devs"

# 2. The bundle, unpacked at /opt/flashq.
t=$(date +%s.%N)
TARBALL=$("$SRC/deploy/bundle.sh" --build-dir "$BUILD" --out-dir "$WORK")
mkdir -p "$ROOTFS/opt/flashq"
tar -C "$ROOTFS/opt/flashq" --strip-components=1 -xzf "$TARBALL"
log "bundle $(basename "$TARBALL") ($(du -h "$TARBALL" | cut -f1)) made and unpacked in $(elapsed "$t") s"
. "$ROOTFS/opt/flashq/share/flashq/bundle.env"

MOUNT_CUDA=
if [ "$FLASHQ_BUNDLE_NEEDS_CUBLASLT" = 1 ]; then
  lt=$(ldconfig -p | sed -n 's/^[[:space:]]*libcublasLt\.so\.13 .*=> //p' | head -n1)
  [ -n "$lt" ] || lt=/usr/local/cuda/lib64/libcublasLt.so.13
  [ -e "$lt" ] || fail "CUDA build, but this host has no libcublasLt.so.13 to lend the root"
  MOUNT_CUDA=$(dirname "$(readlink -f "$lt")")
  mkdir -p "$ROOTFS/usr/local/cuda/lib64"
  log "CUDA build: lending the host's cuBLASLt folder $MOUNT_CUDA read-only at /usr/local/cuda/lib64"
fi

# 3. Start the server inside the root: private mount namespace (proc, and the CUDA
# folder when needed), a bare environment, ports picked free on loopback.
read -r GRPC_PORT METRICS_PORT < <("$PY" - <<'PY'
import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])
PY
)
# The demo repository (~400 MB of generated weights, 30-45 s to generate here) is
# generated inside the root on the first run and kept in the cache; later runs hard-link
# it in. The server regenerates it if its stamp (generator version, seed) changed.
DEMO_CACHE="$CACHE/demo-repository"
if [ -d "$DEMO_CACHE" ]; then
  cp -al "$DEMO_CACHE" "$ROOTFS/var/cache/flashq-demo"
  log "demo repository linked in from $DEMO_CACHE"
else
  mkdir -p "$ROOTFS/var/cache/flashq-demo"
  log "demo repository will be generated in the root (first run)"
fi
SERVER_ARGS=(--backend=cpu --host=127.0.0.1 --grpc-port="$GRPC_PORT" --metrics-port="$METRICS_PORT" --http-port=0
             --demo-cache-dir=/var/cache/flashq-demo ${FLASHQ_BUNDLE_TEST_SERVER_ARGS:-})
INNER='mount -t proc proc "$R/proc"
if [ -n "$C" ]; then mount --bind "$C" "$R/usr/local/cuda/lib64" && mount -o remount,bind,ro "$R/usr/local/cuda/lib64"; fi
exec chroot "$R" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root /opt/flashq/bin/flashq "$@"'
t=$(date +%s.%N)
R="$ROOTFS" C="$MOUNT_CUDA" unshare --mount --propagation private -- sh -c "$INNER" flashq "${SERVER_ARGS[@]}" \
  >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
log "server started in the root (pid $SERVER_PID): /opt/flashq/bin/flashq ${SERVER_ARGS[*]}"

# 4. Health from outside, with the build's flashq-health.
ready=
for _ in $(seq 1 1500); do
  kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/server.log"; fail "server exited before it became healthy"; }
  if "$BUILD/bin/flashq-health" --addr "127.0.0.1:$GRPC_PORT" --timeout-ms 500 --quiet 2>/dev/null; then ready=1; break; fi
  sleep 0.2
done
[ -n "$ready" ] || { tail -n 40 "$WORK/server.log"; fail "not SERVING within 300 s"; }
log "SERVING after $(elapsed "$t") s (gRPC health, from outside the root); server: $(grep -o 'ready in.*' "$WORK/server.log" || true)"
if [ ! -d "$DEMO_CACHE" ]; then
  rm -rf "$DEMO_CACHE.tmp" && cp -al "$ROOTFS/var/cache/flashq-demo" "$DEMO_CACHE.tmp" && mv "$DEMO_CACHE.tmp" "$DEMO_CACHE"
fi
# The bundled health tool works inside the root too (same launcher, same libraries).
R="$ROOTFS" unshare --mount --propagation private -- sh -c \
  'mount -t proc proc "$R/proc"; exec chroot "$R" /usr/bin/env -i PATH=/usr/bin:/bin /opt/flashq/bin/flashq-health --addr "127.0.0.1:$1"' \
  sh "$GRPC_PORT" || fail "bundled flashq-health inside the root did not report SERVING"

# 5. One inference and the metrics, from outside.
"$PY" "$SRC/tests/deploy/infer_once.py" "127.0.0.1:$GRPC_PORT" "127.0.0.1:$METRICS_PORT" ||
  { tail -n 40 "$WORK/server.log"; fail "inference or metrics check failed"; }

# 6. Graceful stop.
t=$(date +%s.%N)
kill -TERM "$SERVER_PID"
for _ in $(seq 1 100); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$SERVER_PID" 2>/dev/null; then
  tail -n 20 "$WORK/server.log"; fail "server still running 10 s after SIGTERM"
fi
rc=0; wait "$SERVER_PID" || rc=$?
SERVER_PID=
log "server stopped on SIGTERM in $(elapsed "$t") s, exit code $rc"
# Only 0: the launcher and chroot exec, so $SERVER_PID is the server itself, which drains
# and exits 0 on SIGTERM. 143 would mean something died of the signal instead.
[ "$rc" = 0 ] || { tail -n 20 "$WORK/server.log"; fail "server exit code $rc after SIGTERM (expected 0)"; }
grep -q 'flashq-server: stopped' "$WORK/server.log" || { tail -n 20 "$WORK/server.log"; fail "the server did not drain and stop"; }

# 7. The launcher's cuBLASLt search, in the clean root (no CUDA, empty ldconfig cache):
# pretend the bundle needs cuBLASLt and check it refuses clearly, then finds a stand-in
# in the default CUDA folder and through FLASHQ_CUBLASLT_DIR.
sed -i -e 's/^FLASHQ_BUNDLE_NEEDS_CUBLASLT=.*/FLASHQ_BUNDLE_NEEDS_CUBLASLT=1/' \
       -e 's/^FLASHQ_BUNDLE_CUBLASLT_PROGRAMS=.*/FLASHQ_BUNDLE_CUBLASLT_PROGRAMS="server"/' "$ROOTFS/opt/flashq/share/flashq/bundle.env"
inroot() { chroot "$ROOTFS" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
rm -rf "$ROOTFS/usr/local/cuda"
set +e; msg=$(inroot /opt/flashq/bin/flashq --help 2>&1); rc=$?; set -e
[ "$rc" = 127 ] && grep -q 'needs libcublasLt.so.13' <<<"$msg" || fail "launcher without cuBLASLt: exit $rc, '$msg'"
mkdir -p "$ROOTFS/usr/local/cuda/lib64" "$ROOTFS/srv/cublas"
touch "$ROOTFS/usr/local/cuda/lib64/libcublasLt.so.13" "$ROOTFS/srv/cublas/libcublasLt.so.13"
# (Output captured first: `cmd | grep -q` can fail under pipefail when grep exits early.)
out=$(inroot /opt/flashq/bin/flashq env)
grep -q 'found in: /usr/local/cuda/lib64' <<<"$out" || fail "launcher did not find /usr/local/cuda/lib64: $out"
out=$(inroot FLASHQ_CUBLASLT_DIR=/srv/cublas /opt/flashq/bin/flashq env)
grep -q 'found in: /srv/cublas' <<<"$out" || fail "launcher ignored FLASHQ_CUBLASLT_DIR: $out"
out=$(inroot LD_LIBRARY_PATH=/srv/cublas /opt/flashq/bin/flashq env)
grep -q 'LD_LIBRARY_PATH: /opt/flashq/lib:/srv/cublas:/srv/cublas' <<<"$out" || fail "launcher did not search LD_LIBRARY_PATH: $out"
set +e; inroot /opt/flashq/bin/flashq-health --addr 127.0.0.1:1 --timeout-ms 200 >/dev/null 2>&1; rc=$?; set -e
[ "$rc" = 2 ] || fail "flashq-health must run without cuBLASLt (exit $rc, want 2: no server)"
log "launcher: refuses clearly without cuBLASLt (exit 127); finds it in /usr/local/cuda/lib64, FLASHQ_CUBLASLT_DIR, LD_LIBRARY_PATH"
log "PASSED in $(elapsed "$t0") s"
