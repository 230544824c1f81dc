//go:build tools

// Package tools pins the Kubernetes commands built for envtest (and kubemark,
// the hollow kubelet tests and the dev stack run as nodes).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubemark"
)
