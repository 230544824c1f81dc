// Package grpcserve runs the three gRPC listeners of a shard leader:
// Registration (TLS 1.3, no client certificate), Operator and Agent (TLS 1.3
// mTLS against the cluster CA, roles enforced by the authz interceptors).
// Every server recovers from a panicking handler: the panic is logged with
// its method and the call answers Internal; the server keeps serving.
// shard.limits apply to every listener (concurrent streams per connection,
// message sizes, connections per source address), to Registration
// (attempts per source address), to Operator (watches per identity) and to
// Agent (streams per agent identity), through internal/server/limits.
package grpcserve
