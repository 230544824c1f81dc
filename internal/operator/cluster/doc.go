// Package cluster manages the cluster-level Cluster API objects: it
// creates the NstanceCluster, NstanceControlPlane and CAPI Cluster named
// after the cluster ID when they are missing (and points an existing
// Cluster without a control plane at the NstanceControlPlane), and reports
// one failure domain per configured shard on the NstanceCluster. The
// kubeconfig Secret is the control plane's (package controlplane).
package cluster
