//go:build tools

// Package tools pins the commands build.sh compiles into this module's graph: the control plane
// (kube-apiserver, kubectl, kube-scheduler) and the real test node's kubelet and
// kube-controller-manager, so every Kubernetes binary the tests run is one version.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
