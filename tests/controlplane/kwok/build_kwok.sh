#!/usr/bin/env bash
# Builds kwok (sigs.k8s.io/kwok/cmd/kwok) from this Go module, pinned to one release, and caches
# the binary outside the checkout, keyed by version and the module files. A second run finds the
# cache and returns at once. Prints the binary's path on stdout (last line).
#
#   HYPERTOPO_CACHE  cache root (default ~/.cache/hypertopo; see ../go_build_lib.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../go_build_lib.sh"
version=$(go_mod_version sigs.k8s.io/kwok)
go_build_cache kwok "$version"
go_binary kwok sigs.k8s.io/kwok/cmd/kwok
