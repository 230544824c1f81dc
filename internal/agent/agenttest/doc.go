// Package agenttest starts a real shard front end in-process for agent tests:
// a cluster CA and nonce key, helper-5's Registration service and the
// agentapi Agent service on TLS/mTLS loopback listeners (grpcserve), with
// instances and their templates held in memory. It can stop and restart the
// servers on the same ports to exercise reconnects.
package agenttest
