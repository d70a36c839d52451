#!/usr/bin/env bash
# Builds the test cluster's Kubernetes from one pinned Go module in one `go build`: the control plane
# (kube-apiserver, kubectl, kube-scheduler, and etcd from ./cmd/etcd) and the real node's kubelet and
# kube-controller-manager, so the packages they share compile once. The binaries are cached outside
# the checkout (go_build_lib.sh: the cache key, the lock that makes concurrent setups wait for one
# build, the toolchain); a second run finds the cache and returns at once. Prints the cache
# directory on stdout (last line).
#
#   build.sh           the newest supported Kubernetes (this folder's go.mod), which the suite runs
#   build.sh compat    the oldest supported minor (compat/go.mod: kube-apiserver and kubectl only;
#                      the compatibility tests run them over this build's etcd)
#   HYPERTOPO_CACHE    cache root (default ~/.cache/hypertopo)
set -euo pipefail
plane=$(cd "$(dirname "$0")" && pwd)
here=$plane/${1:-.}
here=$(cd "$here" && pwd)
source "$plane/go_build_lib.sh"
k8s_version=$(go_mod_version k8s.io/kubernetes)
go_build_cache controlplane "$k8s_version"
if [[ -d "$here/cmd/etcd" ]]; then
  out="$out$(sha256sum "$here/cmd/etcd/main.go" | cut -c1-4)"
fi
# The packages: the commands tools.go pins, plus the module's own etcd.
mapfile -t packages < <(sed -n 's/^[[:space:]]*_ "\(k8s.io\/kubernetes\/cmd\/[^"]*\)"$/\1/p' "$here/tools.go")
[[ ! -d "$here/cmd/etcd" ]] || packages+=(./cmd/etcd)
bins=("${packages[@]##*/}")

all_built() {
  local bin
  for bin in "${bins[@]}"; do [[ -x "$out/$bin" ]] || return 1; done
}

all_built || go_build_lock controlplane
if all_built; then
  echo "Kubernetes $k8s_version (${bins[*]}) cached in $out" >&2
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
echo "building ${bins[*]} ($k8s_version) in one go build; cold on 2 cores this takes about half an hour ..." >&2
CGO_ENABLED=0 "$go_bin" build -trimpath -ldflags "$ldflags" -o "$tmp/" "${packages[@]}" >&2
rm -rf "$out" && mv "$tmp" "$out"
echo "built Kubernetes $k8s_version (${bins[*]}) in $(( $(date +%s) - start ))s into $out" >&2
echo "$out"
