// Package agent holds the tests that run the agent (internal/agent/app, in
// process) against real shard server code (agenttest): registration, key
// generation, file delivery, drift, large files and identity renewal.
package agent
