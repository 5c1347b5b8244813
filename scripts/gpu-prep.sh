#!/usr/bin/env bash
# Prepares what a run on the GPU machine needs that it cannot fetch itself:
# GoogleTest sources (from Debian's googletest package) under .deps/, which is
# git-ignored and travels with `carry: [".deps"]`.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .deps
if [ ! -f .deps/googletest/CMakeLists.txt ]; then
  [ -d /usr/src/googletest ] || { apt-get install -y -q googletest >/dev/null; }
  cp -r /usr/src/googletest .deps/googletest
fi
echo ".deps ready: $(du -sh .deps | cut -f1)"
