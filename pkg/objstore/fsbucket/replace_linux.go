package fsbucket

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// replace moves tmp onto path atomically. When path is an existing regular
// file it swaps the two names (renameat2 RENAME_EXCHANGE) and unlinks the
// old body: on ext4 a plain rename over an existing file forces the new
// file's data to disk (auto_da_alloc), which made every overwrite several
// times slower. The caller holds the key's lock.
func replace(tmp, path string) error {
	st, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return os.Rename(tmp, path)
	case err != nil:
		return err
	case !st.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular file", path)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, path, unix.RENAME_EXCHANGE); err != nil {
		// EINVAL/ENOSYS: the file system cannot exchange.
		return os.Rename(tmp, path)
	}
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove replaced body: %w", err)
	}
	return nil
}
