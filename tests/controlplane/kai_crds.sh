#!/usr/bin/env bash
# Prints the directory holding NVIDIA KAI Scheduler's CRDs (Topology, Queue, PodGroup, ...), taken
# from its Go module (pinned version, checked against the Go checksum database) through the Go
# module proxy, so tests can install KAI's real Topology CRD on the test API server. Cached in Go's
# module cache (shared with the control plane's builds). v0.12.0 is the first KAI release with
# kai.scheduler's own Topology CRD (v0.10 and the retracted v0.20.x ship Kueue's); its Topology CRD
# is the same as on KAI's main branch of March 2026.
set -euo pipefail
version=v0.12.0
dir=$(cd /tmp && GOFLAGS=-mod=mod go mod download -json "github.com/NVIDIA/KAI-scheduler@$version" \
  | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("Dir") or sys.exit(d.get("Error", "no Dir")))')
echo "$dir/deployments/kai-scheduler/crds"
