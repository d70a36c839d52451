#!/usr/bin/env bash
# Prints the directory holding Kueue's CRDs (Topology, ResourceFlavor, ...), taken from its Go
# module (pinned version, checked against the Go checksum database) through the Go module proxy,
# so tests can install the real Topology CRD on the test API server. Cached in Go's module cache
# (shared with the control plane's builds).
set -euo pipefail
version=v0.16.2
dir=$(cd /tmp && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kueue@$version" \
  | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error", "no Dir")))')
echo "$dir/config/components/crd/bases"
