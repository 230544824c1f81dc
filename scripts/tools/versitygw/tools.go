//go:build tools

// Package tools pins Versity Gateway, an S3 server of the compatibility
// matrix (test/compat).
package tools

import _ "github.com/versity/versitygw/cmd/versitygw"
