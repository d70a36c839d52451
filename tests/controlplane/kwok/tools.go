//go:build tools

// Package tools pins the kwok command that build_kwok.sh compiles from this module's graph.
package tools

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
