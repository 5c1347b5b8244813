#!/usr/bin/env bash
# Installs whatever is missing on a Debian 12 machine to build and test flashq:
# the Debian packages (compilers, gRPC, protobuf, Abseil, prometheus-cpp,
# GoogleTest, Google Benchmark, the Prometheus server used by the metrics test, clang
# with its sanitizer/libFuzzer runtimes and openssl for the reliability tests, podman
# with runc and netavark for the container tests) and a Python virtual environment in
# .venv with the test clients.
# Idempotent: with everything present it only checks and exits in a second or two.
#
#   scripts/setup.sh            # install what is missing
#   FLASHQ_SKIP_APT=1 ...       # skip the Debian packages (e.g. no root, already provisioned)
#
# Why tritonclient[grpc,http]==2.50.0: the PyPI package `perf-analyzer` is an empty
# placeholder; the real perf_analyzer binary ships inside the tritonclient wheel,
# and 2.50.0 is the newest whose binary runs on Debian 12's glibc 2.36 (2.52+ need
# GLIBC_2.38). It links libb64.so.0d (Debian libb64-0d) and libcudart.so.12 (from the
# nvidia-cuda-runtime-cu12 wheel, needed even without a GPU); scripts/perf_analyzer
# sets LD_LIBRARY_PATH for it.
#
# Why podman-compose from PyPI: Debian 12's 1.0.3 leaves `${VAR:-}` in compose files
# unexpanded and quotes exec-form healthchecks wrongly; 1.6.0 is the version the compose
# test runs with Debian 12's podman 4.3.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev libssl-dev
  prometheus-cpp-dev libcpp-httplib-dev nlohmann-json3-dev libgtest-dev googletest libbenchmark-dev libgoogle-perftools-dev
  prometheus libb64-0d python3-venv python3-pip curl
  clang libclang-rt-14-dev openssl debootstrap docker-compose
  podman runc netavark aardvark-dns iptables
)
PY_PACKAGES=(numpy pytest matplotlib "tritonclient[grpc,http]==2.50.0" nvidia-cuda-runtime-cu12 grpcio-health-checking grpcio-reflection kubernetes-validate safetensors podman-compose==1.6.0)

log() { echo "setup: $*"; }

# ---- Debian packages --------------------------------------------------------------
if [ "${FLASHQ_SKIP_APT:-0}" != 1 ]; then
  missing=()
  for p in "${APT_PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [ "$status" = "install ok installed" ] || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    log "Debian packages: all ${#APT_PACKAGES[@]} present"
  else
    log "Debian packages missing: ${missing[*]}"
    if [ "$(id -u)" = 0 ]; then SUDO=(); elif command -v sudo >/dev/null; then SUDO=(sudo); else
      log "not root and no sudo: install them yourself, then rerun with FLASHQ_SKIP_APT=1"; exit 1; fi
    export DEBIAN_FRONTEND=noninteractive
    "${SUDO[@]}" apt-get update -q
    # The prometheus package would start a system service on a plain Debian box;
    # we only need its binary (the metrics test starts its own instance).
    "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
    log "installed: ${missing[*]}"
  fi
else
  log "Debian packages: skipped (FLASHQ_SKIP_APT=1)"
fi

# ---- Python virtual environment ---------------------------------------------------
VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  python3 -m venv "$VENV"
fi
# Quick check first: importing everything costs a second; pip only when something is missing.
if "$VENV/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as md, sys
need = {"numpy": None, "pytest": None, "matplotlib": None, "tritonclient": "2.50.0",
        "nvidia-cuda-runtime-cu12": None, "grpcio-health-checking": None, "grpcio-reflection": None, "kubernetes-validate": None,
        "safetensors": None, "podman-compose": "1.6.0", "geventhttpclient": None}
for name, ver in need.items():
    v = md.version(name)
    if ver and v != ver:
        sys.exit(1)
import tritonclient.grpc, tritonclient.http, numpy, grpc_health.v1.health_pb2, grpc_reflection.v1alpha.reflection_pb2, safetensors
PY
then
  log "Python venv: all packages present ($VENV)"
else
  log "installing Python packages into $VENV: ${PY_PACKAGES[*]}"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${PY_PACKAGES[@]}"
  log "Python packages installed"
fi

# perf_analyzer: check that the bundled binary runs (glibc, libb64, libcudart).
if scripts/perf_analyzer --help >/dev/null 2>&1 || scripts/perf_analyzer --version >/dev/null 2>&1; then
  log "perf_analyzer: OK ($(scripts/perf_analyzer --path))"
else
  log "warning: perf_analyzer does not run here (scripts/perf_analyzer --help); the perf_analyzer test will fail"
fi
log "done"
