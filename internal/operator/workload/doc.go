// Package workload gives the controllers that act on Nodes and Pods (the
// drain coordinator, on-demand pods) the workload cluster of a Cluster API
// Cluster: a cached client (Nodes indexed by spec.providerID), an uncached
// reader, an eviction client and an Event recorder, plus watches. In
// in-cluster mode that is the operator's own API server; in management mode
// it is the cluster the <cluster>-kubeconfig Secret points to, reached
// through core Cluster API's ClusterCache (one connection, cache and health
// probe per workload cluster, re-established when the Secret changes).
package workload
