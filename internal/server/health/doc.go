// Package health serves the plain-HTTP health port (GET /health: 503 until
// the config is loaded and the cache synced, then 200; GET /metrics from the
// app's own Prometheus registry) and the election status handler used on the
// HTTPS election port.
package health
