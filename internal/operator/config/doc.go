// Package config loads the nstance-operator configuration: the YAML file
// naming the cluster, tenant and shard endpoints, and the NSTANCE_*
// environment variables naming the Kubernetes objects the operator uses.
package config
