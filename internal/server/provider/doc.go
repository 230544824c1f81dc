// Package provider defines how nstance-server asks an infrastructure backend
// for instances: create, list, status and delete. Implementations live in
// sub-packages: tmux and process run real agent processes on the local
// machine for development and tests, mock only keeps records, aws runs EC2
// instances, proxmox runs Proxmox VE VMs cloned from a template.
//
// Each implementation is a Kind: a name for shard.infra.provider and the
// type of its shard.infra.options block with its defaults and validation.
// The server's assembly builds a Registry of the kinds it ships; the
// registry decodes the block strictly (unknown keys and wrong types named by
// key path), validates it and builds the provider.
//
// Provider IDs have the form nstance://{cluster}/{shard}/{instanceID}; the
// server computes them (see ID) and hands them to the provider, which must
// report them back unchanged and write them into any fake Kubernetes Node
// it creates.
package provider
