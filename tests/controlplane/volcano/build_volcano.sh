#!/usr/bin/env bash
# Builds Volcano's scheduler and controller manager (vc-scheduler, vc-controller-manager) from this
# Go module, pinned to one release, and copies Volcano's own CRDs (config/crd/volcano/bases/*.yaml of
# the same module) beside them. Cached outside the checkout, keyed by version and the module files;
# a second run finds the cache and returns at once. Prints the cache directory on stdout (last line):
#   DIR/vc-scheduler  DIR/vc-controller-manager  DIR/crds/*.yaml
#
#   build_volcano.sh          the binaries and the CRDs
#   build_volcano.sh crds     the CRDs only (a module download, no compile): what the test control
#                             plane needs to start; the binaries follow on a later full run
#
#   HYPERTOPO_CACHE  cache root (default ~/.cache/hypertopo; see ../go_build_lib.sh)
set -euo pipefail
what=${1:-all}
case "$what" in all|crds) ;; *) echo "usage: $0 [all|crds]" >&2; exit 2 ;; esac
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../go_build_lib.sh"
version=$(go_mod_version volcano.sh/volcano)
go_build_cache volcano "$version"
have_crds() { [[ -f "$out/crds/.complete" ]]; }
have_bins() { [[ -x "$out/vc-scheduler" && -x "$out/vc-controller-manager" ]]; }
cached() {
  if have_crds && { [[ $what == crds ]] || have_bins; }; then
    echo "volcano $version ($what) cached in $out" >&2
    echo "$out"
    exit 0
  fi
}
cached
go_build_lock volcano
cached
go_toolchain
cd "$here"
mkdir -p "$out"

if ! have_crds; then
  # The CRDs of exactly the release the binaries come from (vc-scheduler's informers wait for each).
  "$go_bin" mod download volcano.sh/volcano >&2
  src=$("$go_bin" list -m -f '{{.Dir}}' volcano.sh/volcano)
  tmp=$(mktemp -d "$out/crds.tmp.XXXXXX")
  cp "$src"/config/crd/volcano/bases/*.yaml "$tmp/"
  chmod 755 "$tmp"
  chmod 644 "$tmp"/*.yaml
  touch "$tmp/.complete"
  rm -rf "$out/crds" && mv "$tmp" "$out/crds"
  echo "copied $(ls "$out/crds" | wc -l) Volcano $version CRDs from $src into $out/crds" >&2
fi

if [[ $what == all ]] && ! have_bins; then
  tmp=$(mktemp -d "$out/bin.tmp.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  ldflags="-s -w -X volcano.sh/volcano/pkg/version.Version=$version"
  ldflags="$ldflags -X volcano.sh/volcano/pkg/version.GitSHA=module -X volcano.sh/volcano/pkg/version.Built=1970-01-01"
  start=$(date +%s)
  echo "building volcano.sh/volcano/cmd/scheduler and cmd/controller-manager ($version) ..." >&2
  # One `go build` for both: they share most packages, compiled once (CGO off, as Volcano's Makefile).
  CGO_ENABLED=0 "$go_bin" build -trimpath -ldflags "$ldflags" -o "$tmp/" \
    volcano.sh/volcano/cmd/scheduler volcano.sh/volcano/cmd/controller-manager >&2
  mv "$tmp/scheduler" "$out/vc-scheduler"
  mv "$tmp/controller-manager" "$out/vc-controller-manager"
  echo "built vc-scheduler and vc-controller-manager $version in $(( $(date +%s) - start ))s into $out" >&2
fi
echo "$out"
