//go:build tools

// Package tools pins Overmind for `make check`.
package tools

import _ "github.com/DarthSim/overmind/v2"
