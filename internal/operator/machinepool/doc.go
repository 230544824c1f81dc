// Package machinepool reconciles NstanceMachinePools. The size comes from the
// MachinePool whose infrastructureRef names the pool; it is split over the
// pool's shards (PlanReplicas, plan.go; a scale-down marks the victims
// Cluster API chose first, scale.go) into one NstanceShardGroup per shard, named
// {group}--{shard} and owned by the pool. The pool status follows the Cluster
// API MachinePool contract: spec.providerIDList is the sorted union of the
// shard groups' provider IDs, and status.replicas, ready and
// initialization.provisioned summarise them. For Cluster API's MachinePool
// Machines the pool reports status.infrastructureMachineKind NstanceMachine
// and keeps one NstanceMachine per member instance (machines.go).
package machinepool
