//go:build tools

// Package tools pins promtool, Prometheus's rule checker and rule unit-test
// runner, for `make bin/promtool` (internal/packaging runs the alert tests in
// deploy/monitoring/tests with it).
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
