// Package capacity publishes what one machine of a pool or machine template
// offers, for cluster-autoscaler's scale from zero: status.capacity (cpu,
// memory, pods, ephemeral-storage, nvidia.com/gpu) and status.nodeInfo
// (architecture, operatingSystem), in the form the Cluster API "Opt-in
// Autoscaling from Zero" contract describes and the autoscaler's clusterapi
// provider reads from the infrastructure template or pool.
//
// The operator never talks to a cloud: it asks a shard server
// (DescribeInstanceType, by template or instance type), which answers from
// its config's instance_types catalog or its provider (AWS
// DescribeInstanceTypes). Of turns the answer into the status fields (a
// pure function); Catalog asks the shards and caches answers for a while;
// SetPool and SetTemplate apply them to an object, keeping what it had when
// no shard answers.
package capacity
