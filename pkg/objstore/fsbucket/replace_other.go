//go:build !linux

package fsbucket

import "os"

// replace moves tmp onto path atomically. It never leaves the old body at
// tmp (swapped is always false).
func replace(tmp, path string) (swapped bool, err error) { return false, os.Rename(tmp, path) }
