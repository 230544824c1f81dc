// Package cluster reconciles NstanceClusters: it reports one failure domain
// per configured shard. The Cluster, NstanceCluster and NstanceControlPlane
// are the user's (templates/); the operator creates none of them.
// EnsureObjects builds them the way the templates do, for tests and tools. The
// kubeconfig Secret is the control plane's (package controlplane).
package cluster
