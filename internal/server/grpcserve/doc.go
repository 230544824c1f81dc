// Package grpcserve runs the three gRPC listeners of a shard leader:
// Registration (TLS 1.3, no client certificate), Operator and Agent (TLS 1.3
// mTLS against the cluster CA, role enforced by the authz interceptors).
package grpcserve
