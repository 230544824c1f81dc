// Package atomicfile writes files so that readers see either the old or the
// new content, never a torn one: a synced temporary sibling renamed over the
// target, inside an os.Root so the write cannot escape its directory. After
// the rename the directory itself is synced, so the new name survives a
// crash (without it a power loss can bring back the old file, or none).
package atomicfile

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
)

// Write replaces rel (slash-separated, relative to root) with data and mode,
// then syncs rel's directory.
func Write(root *os.Root, rel string, data []byte, mode fs.FileMode) error {
	return write(root, rel, data, mode, SyncDir)
}

func write(root *os.Root, rel string, data []byte, mode fs.FileMode, syncDir func(*os.Root, string) error) error {
	var rnd [6]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return fmt.Errorf("temporary name for %s: %w", rel, err)
	}
	tmp := path.Join(path.Dir(rel), "."+path.Base(rel)+".tmp-"+hex.EncodeToString(rnd[:]))
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("creating temporary file for %s: %w", rel, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Rename(tmp, rel)
	}
	if err != nil {
		_ = root.Remove(tmp)
		return fmt.Errorf("writing %s: %w", rel, err)
	}
	if err := syncDir(root, path.Dir(rel)); err != nil {
		return fmt.Errorf("writing %s: %w", rel, err)
	}
	return nil
}

// SyncDir fsyncs directory dir (slash-separated, relative to root) so the
// renames and removals made in it are durable.
func SyncDir(root *os.Root, dir string) error {
	d, err := root.Open(dir)
	if err != nil {
		return fmt.Errorf("opening directory %s to sync it: %w", dir, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("syncing directory %s: %w", dir, err)
	}
	return nil
}

// WritePath is Write for a plain path: the file's directory is the root.
func WritePath(p string, data []byte, mode fs.FileMode) error {
	root, err := os.OpenRoot(filepath.Dir(p))
	if err != nil {
		return fmt.Errorf("opening directory of %s: %w", p, err)
	}
	defer root.Close()
	return Write(root, filepath.Base(p), data, mode)
}

// RemovePath removes the file at p (a missing file is not an error) and
// syncs its directory so the removal is durable.
func RemovePath(p string) error {
	root, err := os.OpenRoot(filepath.Dir(p))
	if err != nil {
		return fmt.Errorf("opening directory of %s: %w", p, err)
	}
	defer root.Close()
	if err := root.Remove(filepath.Base(p)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing %s: %w", p, err)
	}
	return SyncDir(root, ".")
}
