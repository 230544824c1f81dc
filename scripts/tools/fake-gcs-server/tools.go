//go:build tools

// Package tools pins fake-gcs-server, the GCS emulator pkg/objstore/gcsstore's
// tests run as a process on loopback.
package tools

import _ "github.com/fsouza/fake-gcs-server"
