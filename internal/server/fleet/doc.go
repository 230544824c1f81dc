// Package fleet assembles the instance-management side of nstance-server:
// the provider chosen by shard.infra.provider, the instance store, the group
// registry, the reconciler and the Operator gRPC service. The server app
// builds one Fleet, registers Fleet.Service on the operator listener and runs
// Fleet.Run for as long as it leads the shard.
package fleet
