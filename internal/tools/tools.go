//go:build tools

// Package tools keeps modules in go.mod that the project uses only for their
// files: the cluster-api module ships the CAPI CRDs that envtest installs.
package tools

import _ "sigs.k8s.io/cluster-api/util/conditions"
