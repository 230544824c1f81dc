// Package shard is nstance-admin's client side of the Operator API: it
// parses the --servers list (shard=host:port,...), dials each shard over
// mTLS with an operator certificate, runs config and group operations on one
// or all shards, and serves the same operations as a small JSON HTTP API.
package shard
