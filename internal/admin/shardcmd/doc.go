// Package shardcmd defines nstance-admin's shard commands: `config
// status|refresh`, `group list|create|scale|delete|status` and `serve` (the
// same operations as a JSON HTTP API). Each talks to one or more shard
// servers' Operator API over mTLS (--servers shard=host:port,... with
// --shard NAME or --all-shards) using an operator certificate.
package shardcmd
