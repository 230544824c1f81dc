//go:build tools

// Package tools pins SeaweedFS, an S3 server of the compatibility matrix
// (test/compat).
package tools

import _ "github.com/seaweedfs/seaweedfs/weed"
