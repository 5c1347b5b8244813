#!/usr/bin/env bash
# Packages an existing build into a relocatable tarball; builds nothing.
#
#   deploy/bundle.sh [--build-dir build] [--out-dir .] [--version V]
#   -> OUT_DIR/flashq-bundle-<version>-<arch>.tar.gz   (path printed on the last line)
#
# Layout of the tarball (one top folder, flashq-bundle-<version>-<arch>/):
#   bin/flashq                 launcher: sets LD_LIBRARY_PATH, finds the host's cuBLASLt, execs
#   bin/flashq-server, bin/flashq-health, bin/flashq-bench   symlinks to the launcher
#   libexec/                   the real executables (from BUILD_DIR/bin)
#   lib/                       every shared library they need that a bare Linux host lacks
#   share/flashq/MANIFEST      version, commit, flavour (cpu|cuda), what was bundled and left out
#
# What is left out on purpose, and found on the host instead:
#   - the C and C++ runtimes (glibc and its loader, libm, libstdc++, libgcc_s): every host has
#     them; bundling glibc pieces breaks more than it fixes. The host's glibc must be at least
#     the build machine's (Debian 12: 2.36) and its libstdc++ at least GCC 12's.
#   - the CUDA driver (libcuda.so.1, libnvidia-*): belongs to the host's kernel driver.
#   - cuBLASLt/cuBLAS (libcublasLt.so.13 is 517 MB): the launcher finds the host's, see bin/flashq.
#   The CUDA runtime (libcudart.so.13, under 1 MB, redistributable) IS carried when the server
#   links it dynamically: it only needs a driver at least as new as the build's CUDA.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD_DIR=build
OUT_DIR=.
VERSION=
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD_DIR=$2; shift 2 ;;
    --build-dir=*) BUILD_DIR=${1#*=}; shift ;;
    --out-dir) OUT_DIR=$2; shift 2 ;;
    --out-dir=*) OUT_DIR=${1#*=}; shift ;;
    --version) VERSION=$2; shift 2 ;;
    --version=*) VERSION=${1#*=}; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "bundle: unknown argument $1" >&2; exit 64 ;;
  esac
done
case "$BUILD_DIR" in /*) ;; *) BUILD_DIR="$PWD/$BUILD_DIR" ;; esac
BIN="$BUILD_DIR/bin"
log() { echo "bundle: $*" >&2; }

[ -x "$BIN/flashq-server" ] || { log "no $BIN/flashq-server: build first (scripts/build.sh)"; exit 1; }
[ -x "$BIN/flashq-health" ] || { log "no $BIN/flashq-health: build first (scripts/build.sh)"; exit 1; }
EXES=(flashq-server flashq-health)
[ -x "$BIN/flashq-bench" ] && EXES+=(flashq-bench)

if [ -z "$VERSION" ]; then
  base=$(sed -n 's/^project(flashq VERSION \([0-9.]*\).*/\1/p' "$ROOT/CMakeLists.txt" | head -n1)
  sha=$(git -C "$ROOT" rev-parse --short=8 HEAD 2>/dev/null || echo nogit)
  VERSION="${base:-0.0.0}-$sha"
fi
ARCH=$(uname -m)
NAME="flashq-bundle-$VERSION-$ARCH"
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
STAGE=$(mktemp -d "$OUT_DIR/.bundle.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
DEST="$STAGE/$NAME"
mkdir -p "$DEST/bin" "$DEST/libexec" "$DEST/lib" "$DEST/share/flashq"

# Sonames that stay on the host (see the header).
is_host_lib() {
  case "$1" in
    linux-vdso.so.*|linux-gate.so.*|ld-linux*.so.*|ld64.so.*) return 0 ;;
    libc.so.*|libm.so.*|libmvec.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libutil.so.*) return 0 ;;
    libresolv.so.*|libanl.so.*|libnsl.so.*|libBrokenLocale.so.*|libnss_*.so.*) return 0 ;;
    libstdc++.so.*|libgcc_s.so.*) return 0 ;;
    libcuda.so.*|libnvidia-*.so.*|libcublasLt.so.*|libcublas.so.*) return 0 ;;
  esac
  return 1
}

needs_cublaslt=0
cublas_programs=
declare -A bundled=() left=()
for exe in "${EXES[@]}"; do
  cp -L "$BIN/$exe" "$DEST/libexec/$exe"
  chmod 755 "$DEST/libexec/$exe"
  ln -s flashq "$DEST/bin/$exe"
  # ldd resolves the whole closure; a library it cannot find is an error unless it
  # is one the host provides (e.g. cuBLASLt on a build machine without CUDA).
  while read -r soname arrow path _; do
    [ "$arrow" = "=>" ] || continue
    case "$soname" in libcublasLt.so.*) needs_cublaslt=1; cublas_programs="$cublas_programs ${exe#flashq-}" ;; esac
    if is_host_lib "$soname"; then left[$soname]=1; continue; fi
    if [ "$path" = "not" ]; then log "$exe needs $soname, which ldd cannot find"; exit 1; fi
    if [ -z "${bundled[$soname]:-}" ]; then
      cp -L "$path" "$DEST/lib/$soname"
      chmod 644 "$DEST/lib/$soname"
      bundled[$soname]=$path
    fi
  done < <(ldd "$BIN/$exe")
done

# flashq-bench's plot script travels next to its binary.
[ -f "$BIN/flashq_bench_plot.py" ] && cp "$BIN/flashq_bench_plot.py" "$DEST/libexec/"

# Launcher: one script; the symlinks name the program to run.
cat >"$DEST/bin/flashq" <<'LAUNCHER'
#!/bin/sh
# flashq bundle launcher. Runs a bundled program with the bundle's libraries first on
# LD_LIBRARY_PATH, plus the folder holding the host's libcublasLt.so.13 when the
# server needs it (it is never bundled: 517 MB, and it must match the host's CUDA).
#
#   bin/flashq [server|health|bench] ARGS...   (default: server)
#   bin/flashq-server ARGS...                  (same, through the symlinks)
#   bin/flashq env                             what it found, for debugging
#
# cuBLASLt is searched in: $FLASHQ_CUBLASLT_DIR, $LD_LIBRARY_PATH, $CUDA_HOME/lib64,
# /usr/local/cuda/lib64, /usr/local/cuda-13*/lib64, the ldconfig cache, then the
# nvidia-cublas pip wheel of python3 (site-packages/nvidia/cublas/lib).
set -eu
self=$0
while [ -L "$self" ]; do
  link=$(readlink "$self")
  case "$link" in /*) self=$link ;; *) self=$(dirname "$self")/$link ;; esac
done
here=$(cd "$(dirname "$self")/.." && pwd)
prog=$(basename "$0")
case "$prog" in
  flashq-*) prog=${prog#flashq-} ;;
  *) prog=server
     case "${1:-}" in server|health|bench|env) prog=$1; shift ;; esac ;;
esac

. "$here/share/flashq/bundle.env"

find_cublaslt() {
  for d in ${FLASHQ_CUBLASLT_DIR:-} $(echo "${LD_LIBRARY_PATH:-}" | tr ':' ' ') \
           ${CUDA_HOME:+$CUDA_HOME/lib64} /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 \
           /usr/local/cuda/targets/*/lib; do
    [ -e "$d/libcublasLt.so.13" ] && { echo "$d"; return 0; }
  done
  p=$( (/sbin/ldconfig -p 2>/dev/null || ldconfig -p 2>/dev/null) | sed -n 's/^[[:space:]]*libcublasLt\.so\.13 .*=> //p' | head -n1)
  [ -n "$p" ] && { dirname "$p"; return 0; }
  p=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null || true)
  [ -n "$p" ] && [ -e "$p/libcublasLt.so.13" ] && { echo "$p"; return 0; }
  return 1
}

libpath=$here/lib
cublas_dir=
# Only the programs linked against cuBLASLt need it (flashq-health never does).
needs=0
case " ${FLASHQ_BUNDLE_CUBLASLT_PROGRAMS:-} env " in *" $prog "*) needs=$FLASHQ_BUNDLE_NEEDS_CUBLASLT ;; esac
if [ "$needs" = 1 ]; then
  if cublas_dir=$(find_cublaslt); then
    libpath=$libpath:$cublas_dir
  elif [ "$prog" != env ]; then
    echo "flashq: this bundle's server is built with CUDA and needs libcublasLt.so.13 (CUDA 13)," >&2
    echo "flashq: which it does not carry. Install the CUDA 13 toolkit or the nvidia-cublas wheel," >&2
    echo "flashq: or point FLASHQ_CUBLASLT_DIR at the folder holding it." >&2
    exit 127
  fi
fi
export LD_LIBRARY_PATH=$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

if [ "$prog" = env ]; then
  echo "bundle:          $here ($FLASHQ_BUNDLE_VERSION, $FLASHQ_BUNDLE_FLAVOUR)"
  echo "cuBLASLt needed: $FLASHQ_BUNDLE_NEEDS_CUBLASLT; found in: ${cublas_dir:-none}"
  echo "LD_LIBRARY_PATH: $LD_LIBRARY_PATH"
  exit 0
fi
exe=$here/libexec/flashq-$prog
[ -x "$exe" ] || { echo "flashq: no $prog in this bundle" >&2; exit 127; }
exec "$exe" "$@"
LAUNCHER
chmod 755 "$DEST/bin/flashq"

commit=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)
flavour=cpu; [ "$needs_cublaslt" = 1 ] && flavour=cuda
cat >"$DEST/share/flashq/bundle.env" <<EOF
FLASHQ_BUNDLE_VERSION=$VERSION
FLASHQ_BUNDLE_FLAVOUR=$flavour
FLASHQ_BUNDLE_NEEDS_CUBLASLT=$needs_cublaslt
FLASHQ_BUNDLE_CUBLASLT_PROGRAMS="${cublas_programs# }"
EOF
{
  echo "name: $NAME"
  echo "version: $VERSION"
  echo "commit: $commit"
  echo "flavour: $flavour"
  echo "built-on: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(ldd --version 2>/dev/null | head -n1)"
  echo "executables: ${EXES[*]}"
  echo "bundled:"
  for s in $(printf '%s\n' "${!bundled[@]}" | sort); do echo "  $s  (from ${bundled[$s]})"; done
  echo "left to the host:"
  for s in $(printf '%s\n' "${!left[@]}" | sort); do echo "  $s"; done
} >"$DEST/share/flashq/MANIFEST"

TARBALL="$OUT_DIR/$NAME.tar.gz"
tar -C "$STAGE" --owner=0 --group=0 --numeric-owner -czf "$TARBALL.tmp" "$NAME"
mv "$TARBALL.tmp" "$TARBALL"
log "$(( ${#bundled[@]} )) libraries bundled, flavour $flavour, $(du -h "$TARBALL" | cut -f1)"
echo "$TARBALL"
