#!/usr/bin/env bash
# Installs the newest tritonclient from PyPI into a second virtual environment,
# .venv-tritonclient-latest, beside .venv's pinned one (see scripts/setup.sh for why
# .venv pins 2.50.0). integration.tritonclient_latest runs the tritonclient conformance
# tests with it, so that both the pinned client and the one users get today from
# `pip install tritonclient[grpc,http]` are tested: since 2.70 it takes BF16 inputs only as
# ml_dtypes.bfloat16 arrays and returns BF16 outputs as such (docs/protocol.md).
#
# Every run upgrades to the newest release (a quick no-op when it is installed already). When
# PyPI cannot be reached, an environment that already works is kept, with a warning.
#   scripts/setup-tritonclient-latest.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-tritonclient-latest
log() { echo "setup-tritonclient-latest: $*"; }
works() { "$VENV/bin/python" -c 'import tritonclient.grpc, tritonclient.http, tritonclient.utils, ml_dtypes, numpy, pytest' 2>/dev/null; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV"
  python3 -m venv "$VENV"
fi
if timeout 600 "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade \
     "tritonclient[grpc,http]" numpy pytest; then
  :
elif works; then
  log "warning: could not upgrade from PyPI; keeping the installed tritonclient"
else
  log "error: could not install tritonclient[grpc,http] into $VENV"
  exit 1
fi
works || { log "error: $VENV cannot import tritonclient.grpc, tritonclient.http, ml_dtypes, numpy and pytest"; exit 1; }
log "tritonclient $("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("tritonclient"))') in $VENV"
