// Package backoff computes reconnect delays: exponential growth from a
// minimum to a maximum with random jitter, reset after a success.
package backoff
