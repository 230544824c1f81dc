// Package provider defines how nstance-server asks an infrastructure backend
// for instances: create, list, status, delete, and network attachment (a
// no-op where the backend has no such notion). Implementations live in
// sub-packages: tmux and process run real agent processes on the local
// machine for development and tests, mock only keeps records.
//
// Provider IDs have the form nstance://{cluster}/{shard}/{instanceID} for the
// local providers; the server computes them (see ID) and hands them to the
// provider, which must report them back unchanged and write them into any fake
// Kubernetes Node it creates.
package provider
