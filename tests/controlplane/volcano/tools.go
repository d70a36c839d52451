//go:build tools

// Package tools pins the Volcano commands that build.sh compiles for the test control plane.
package tools

import (
	_ "volcano.sh/volcano/cmd/controller-manager"
	_ "volcano.sh/volcano/cmd/scheduler"
)
