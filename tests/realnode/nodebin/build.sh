#!/usr/bin/env bash
# The real test node's Kubernetes binaries (kubelet, kube-controller-manager, kube-scheduler) are
# those of the test control plane: ../../controlplane/build.sh compiles them with kube-apiserver,
# kubectl and etcd from one pinned Go module in one `go build` (cached; a second run returns at
# once), so the node runs exactly the release the control plane does. Prints that cache directory
# on stdout (last line), as the node's tests expect.
#
#   HYPERTOPO_CACHE  cache root (default ~/.cache/hypertopo)
set -euo pipefail
exec bash "$(cd "$(dirname "$0")" && pwd)/../../controlplane/build.sh"
