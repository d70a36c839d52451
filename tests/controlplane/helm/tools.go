//go:build tools

// Package tools pins the helm command that build_helm.sh compiles from this module's graph.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
)
