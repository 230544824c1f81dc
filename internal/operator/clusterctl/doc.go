// Package clusterctl manages the cluster-level Cluster API objects: it
// creates the NstanceCluster and CAPI Cluster named after the cluster ID when
// they are missing, reports one failure domain per configured shard on the
// NstanceCluster, and keeps the <cluster>-kubeconfig Secret holding a
// ServiceAccount token obtained through TokenRequest, re-requested before it
// expires (skipped when NSTANCE_CAPI_ENDPOINT is set).
package clusterctl
