//go:build tools

// Package tools pins the commands ../build.sh compiles for the compatibility set: the oldest
// supported minor's kube-apiserver and kubectl (etcd comes from the newest build).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
