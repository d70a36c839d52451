#!/usr/bin/env bash
# Builds kwok (sigs.k8s.io/kwok/cmd/kwok) from this Go module, pinned to one release, and caches
# the binary outside the checkout, keyed by version and the module files. A second run finds the
# cache and returns at once. Prints the binary's path on stdout (last line).
#
#   HYPERTOPO_CACHE  cache root (default ~/.cache/hypertopo; see ../go_build_lib.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../go_build_lib.sh"
version=$(go_mod_version sigs.k8s.io/kwok)
go_build_cache kwok "$version"
cached() {
  if [[ -x "$out/kwok" ]]; then
    echo "kwok $version cached in $out" >&2
    echo "$out/kwok"
    exit 0
  fi
}
cached
go_build_lock kwok
cached
go_toolchain

tmp=$(mktemp -d "$out.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$here"
start=$(date +%s)
echo "building sigs.k8s.io/kwok/cmd/kwok ($version) ..." >&2
CGO_ENABLED=0 "$go_bin" build -trimpath -ldflags "-s -w" -o "$tmp/kwok" sigs.k8s.io/kwok/cmd/kwok >&2
rm -rf "$out" && mv "$tmp" "$out"
echo "built kwok $version in $(( $(date +%s) - start ))s into $out" >&2
echo "$out/kwok"
