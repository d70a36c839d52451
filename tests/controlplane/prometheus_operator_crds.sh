#!/usr/bin/env bash
# Prints the directory holding prometheus-operator's CRDs (PodMonitor, PrometheusRule, ...), taken
# from its Go module (pinned version) through the Go module proxy, so tests can install the real
# CRDs and dry-run daemonset/monitoring against them. Cached in Go's module cache.
set -euo pipefail
version=v0.80.1
dir=$(cd /tmp && GOFLAGS=-mod=mod go mod download -json "github.com/prometheus-operator/prometheus-operator@$version" \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
echo "$dir/example/prometheus-operator-crd"
