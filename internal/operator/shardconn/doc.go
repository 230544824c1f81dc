// Package shardconn keeps one mTLS gRPC connection per shard. gRPC redials
// with exponential backoff; a monitor per shard turns connectivity changes
// into per-shard health that controllers read and subscribe to, and that
// nstance_operator_shard_up exports (readiness does not depend on it: one
// shard's outage must not take the webhook endpoint away). The client certificate is renewed through
// RenewCertificate before it expires and swapped in without a restart.
package shardconn
