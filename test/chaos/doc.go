// Package chaos holds fault-injection tests of the shard server's
// invariants: real components (dev-s3 through the AWS SDK, gRPC over TLS on
// loopback, the real agent binary) with faults injected between them, such as
// an S3 proxy that resets the connection after forwarding a write. The tests
// that finish in seconds run with `make test`.
package chaos
