//go:build tools

// Package tools keeps modules in go.mod that the project uses only for their
// files or programs: the cluster-api module ships the CAPI CRDs that envtest
// installs, and clusterctl, which the template tests build
// (internal/operator/capicontract) to render templates/ as a user would.
package tools

import (
	_ "sigs.k8s.io/cluster-api/cmd/clusterctl"
	_ "sigs.k8s.io/cluster-api/util/conditions"
)
