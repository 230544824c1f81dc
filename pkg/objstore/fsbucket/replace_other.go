//go:build !linux

package fsbucket

import "os"

// replace moves tmp onto path atomically.
func replace(tmp, path string) error { return os.Rename(tmp, path) }
