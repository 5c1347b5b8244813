#!/usr/bin/env bash
# Makes (once) and caches a minimal Debian 12 root as a tarball:
#   tests/deploy/debian_root.sh CACHE_DIR      -> prints CACHE_DIR/bookworm-minbase.tar
# debootstrap --variant=minbase gives essential + apt only: no compiler, no -dev
# packages, no gRPC/protobuf/abseil, so a bundle that runs there carries its own.
# The mirror is the one this machine's apt uses (first URIs/deb line naming
# .../debian), unless FLASHQ_DEBIAN_MIRROR is set. Needs root (debootstrap chroots).
set -euo pipefail
cache=${1:?usage: debian_root.sh CACHE_DIR}
suite=${FLASHQ_DEBIAN_SUITE:-bookworm}
tarball=$cache/$suite-minbase.tar
if [ -s "$tarball" ]; then echo "$tarball"; exit 0; fi

mirror=${FLASHQ_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
    grep -v '^\s*#' | grep -oE 'https?://[^ ]+/debian/?' | grep -v security | head -n1 || true)
  mirror=${mirror:-http://deb.debian.org/debian}
fi
command -v debootstrap >/dev/null || { echo "debian_root: debootstrap not installed (apt-get install debootstrap)" >&2; exit 1; }
mkdir -p "$cache"
work=$(mktemp -d "$cache/root.XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$(date +%s)
echo "debian_root: debootstrap --variant=minbase $suite from $mirror (once; cached in $tarball)" >&2
if ! debootstrap --variant=minbase "$suite" "$work/root" "$mirror" >"$work/debootstrap.log" 2>&1; then
  tail -n 30 "$work/debootstrap.log" >&2
  exit 1
fi
# Drop the apt lists and package cache: the test never installs anything there.
rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"*
tar -C "$work/root" -cf "$tarball.tmp" .
mv "$tarball.tmp" "$tarball"
echo "debian_root: made in $(( $(date +%s) - start )) s, $(du -h "$tarball" | cut -f1)" >&2
echo "$tarball"
