#!/usr/bin/env bash
# Builds helm (helm.sh/helm/v3/cmd/helm) from this Go module, pinned to one helm 3 release, and
# caches the binary outside the checkout, keyed by version and the module files. It shares the Go
# module cache with the control plane's builds (most of its k8s.io graph is already there). A
# second run finds the cache and returns at once. Prints the binary's path on stdout (last line).
#
#   HYPERTOPO_CACHE  cache root (default ~/.cache/hypertopo; see ../go_build_lib.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../go_build_lib.sh"
version=$(go_mod_version helm.sh/helm/v3)
go_build_cache helm "$version"
go_binary helm helm.sh/helm/v3/cmd/helm \
  "-X helm.sh/helm/v3/internal/version.version=$version -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
