//go:build tools

// Package tools pins MinIO, an S3 server of the compatibility matrix
// (test/compat).
package tools

import _ "github.com/minio/minio"
