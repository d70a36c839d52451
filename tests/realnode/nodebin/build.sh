#!/usr/bin/env bash
# Builds the real test node's Kubernetes binaries (kubelet, kube-controller-manager, kube-scheduler)
# from this Go module, pinned to the Kubernetes version of tests/controlplane (the same
# k8s.io/kubernetes and staging versions; tests/test_real_node_pins.py checks that), and caches
# them outside the checkout like the other Go builds (../../controlplane/go_build_lib.sh: the cache
# key, the lock that makes concurrent setups wait for one build, the toolchain). A second run finds
# the cache and returns at once. Prints the cache directory on stdout (last line).
#
#   HYPERTOPO_CACHE  cache root (default ~/.cache/hypertopo)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../../controlplane/go_build_lib.sh"
k8s_version=$(go_mod_version k8s.io/kubernetes)
go_build_cache nodebin "$k8s_version"
bins=(kubelet kube-controller-manager kube-scheduler)

all_built() {
  local bin
  for bin in "${bins[@]}"; do [[ -x "$out/$bin" ]] || return 1; done
}

all_built || go_build_lock nodebin
if all_built; then
  echo "node binaries $k8s_version cached in $out" >&2
  echo "$out"
  exit 0
fi

go_toolchain
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$(echo "$k8s_version" | cut -d. -f2)"
ldflags="$ldflags -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
tmp=$(mktemp -d "$out.tmp.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$here"
start=$(date +%s)
for bin in "${bins[@]}"; do
  echo "building $bin ($k8s_version) ..." >&2
  # The control plane's flags, so the Go build cache its build filled is shared.
  CGO_ENABLED=0 nice -n 10 "$go_bin" build -trimpath -ldflags "$ldflags" -o "$tmp/" "k8s.io/kubernetes/cmd/$bin" >&2
done
rm -rf "$out" && mv "$tmp" "$out"
echo "built node binaries $k8s_version in $(( $(date +%s) - start ))s into $out" >&2
echo "$out"
