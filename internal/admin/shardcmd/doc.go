// Package shardcmd defines nstance-admin's commands that talk to shard
// servers' Operator API over mTLS with an operator certificate: `config
// status|refresh`, `group list|create|scale|delete|status`, `instance
// list|get|delete|ack-drain|revoke`, `operator list|revoke`, `revocation
// list|add` (admin certificate) and `serve` (the config and group operations
// as a JSON HTTP API). Connection settings come from flags, NSTANCE_ADMIN_*
// variables or the context file (package conn); results are printed with
// -o table|json|yaml (package output); `group list` and `instance list`
// take --watch.
package shardcmd
