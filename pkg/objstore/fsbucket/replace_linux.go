package fsbucket

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// replace moves tmp onto path atomically. When path is an existing regular
// file it swaps the two names (renameat2 RENAME_EXCHANGE) and reports
// swapped: the old body is then at tmp, for the caller to reuse or unlink.
// On ext4 a plain rename over an existing file forces the new
// file's data to disk (auto_da_alloc), which made every overwrite several
// times slower. The caller holds the key's lock.
func replace(tmp, path string) (swapped bool, err error) {
	st, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return false, os.Rename(tmp, path)
	case err != nil:
		return false, err
	case !st.Mode().IsRegular():
		return false, fmt.Errorf("%s is not a regular file", path)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, path, unix.RENAME_EXCHANGE); err != nil {
		if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOENT) {
			return false, err
		}
		// EINVAL/ENOSYS: the file system cannot exchange.
		return false, os.Rename(tmp, path)
	}
	return true, nil
}
