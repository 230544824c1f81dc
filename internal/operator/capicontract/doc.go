// Package capicontract holds only tests: they run cluster-api's own core
// controllers (Cluster, Machine, MachinePool and the ClusterCache, from the
// sigs.k8s.io/cluster-api module) beside the Nstance operator against a real
// API server, and check that core Cluster API accepts what the operator
// reports: provisioned infrastructure, provider IDs matching Nodes, Running
// phases, and deletion flowing through to the instance.
package capicontract
