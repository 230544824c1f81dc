// Package metrics defines the operator's Prometheus metrics: group sync
// latency, watch stream reconnects, per-shard health and imports.
package metrics
