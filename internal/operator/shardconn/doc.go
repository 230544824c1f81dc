// Package shardconn keeps one mTLS gRPC connection per shard. gRPC redials
// with exponential backoff; a monitor per shard turns connectivity changes
// into per-shard health that controllers read and subscribe to, and that the
// readiness probe reports. The client certificate is renewed through
// RenewCertificate before it expires and swapped in without a restart.
package shardconn
