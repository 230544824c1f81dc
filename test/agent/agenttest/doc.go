// Package agenttest starts a real shard front end in-process for agent tests:
// a cluster CA and nonce key, the server's Registration service
// (registration.New) and Agent service (agentapi) on TLS/mTLS loopback
// listeners (grpcserve), with instances and their templates held in memory
// so a test can change an instance's template without telling the agent
// (drift). It can stop and restart the servers on the same ports to exercise
// reconnects. It lives under test/ because it runs server code: nothing
// under internal/agent imports internal/server.
package agenttest
