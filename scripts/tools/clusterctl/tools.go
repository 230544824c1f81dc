//go:build tools

// Package tools pins clusterctl, Cluster API's command line, for
// test/clusterctl (built by `make bin/clusterctl`). It is a module of its
// own so clusterctl's command-line dependencies stay out of the main go.mod;
// the version is the sigs.k8s.io/cluster-api the main go.mod requires.
package tools

import _ "sigs.k8s.io/cluster-api/cmd/clusterctl"
