package fsbucket

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/nstance-dev/nstance/pkg/objstore"
)

// Replaced bodies are recycled as the temp files of later writes instead of
// being unlinked. On ext4 without a journal (as on many VM images) the inode
// allocator skips inodes freed in the last seconds to minutes, scanning the
// group's bitmap past each of them, so a store that frees one inode per
// overwrite makes every following create slower; a reused inode is neither
// freed nor allocated.
//
// Safety: a reader holds a shared flock on the body it reads (openBody) and
// checks after locking that the file is still the one at the key's path. A
// writer reuses a spare only when it gets an exclusive flock without
// waiting; otherwise the spare is unlinked, as before. So a reader that
// goes through a Bucket (in this or another process) never sees a reused
// body change under it.
const (
	spareDir = "spare"
	// maxSpares bounds the per-Bucket pool; maxSpareSize keeps large bodies
	// from holding disk space while they wait.
	maxSpares    = 64
	maxSpareSize = 1 << 20
)

func (b *Bucket) spareDir() string { return filepath.Join(b.root, HiddenDir, spareDir) }

// takeSpare returns a temp file for a write, opened for writing from offset
// 0: a recycled body when one is free, a new file otherwise.
func (b *Bucket) takeSpare() (*os.File, error) {
	for {
		b.mu.Lock()
		n := len(b.spares)
		if n == 0 {
			b.mu.Unlock()
			break
		}
		name := b.spares[n-1]
		b.spares = b.spares[:n-1]
		b.mu.Unlock()
		f, err := os.OpenFile(name, os.O_WRONLY, 0)
		if err != nil {
			continue // removed behind our back; take another
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			// A reader still has it open: let it keep the old body.
			f.Close()
			os.Remove(name)
			continue
		}
		return f, nil
	}
	return newTemp(b.spareDir())
}

// newTemp creates a new temp file in dir (created when missing) with the
// mode of a stored body, 0o644 (less under a stricter umask; Put then
// corrects it). os.CreateTemp would create it 0o600 and cost a chmod.
func newTemp(dir string) (*os.File, error) {
	for range 10000 {
		name := filepath.Join(dir, TempPrefix+strconv.FormatUint(rand.Uint64(), 36))
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		switch {
		case err == nil:
			return f, nil
		case errors.Is(err, fs.ErrExist):
			continue
		case errors.Is(err, fs.ErrNotExist):
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, fmt.Errorf("create %s: %w", dir, err)
			}
			continue
		}
		return nil, fmt.Errorf("create temp file: %w", err)
	}
	return nil, fmt.Errorf("create temp file in %s: too many names taken", dir)
}

// keepSpare pools the replaced body now at name, or unlinks it when it is
// not a plain single-link file, is large, or the pool is full.
func (b *Bucket) keepSpare(name string) {
	st, err := os.Lstat(name)
	keep := err == nil && st.Mode().IsRegular() && st.Size() <= maxSpareSize
	if s, ok := st.Sys().(*syscall.Stat_t); keep && (!ok || s.Nlink != 1) {
		keep = false
	}
	if keep {
		b.mu.Lock()
		if len(b.spares) < maxSpares {
			b.spares = append(b.spares, name)
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
	}
	os.Remove(name)
}

// install moves the finished temp file tmp to p and pools the body it
// replaces; absent says the caller (holding the key's lock) saw no object at
// p. p's directory is created only when the move finds it missing. A parent
// may be pruned by a concurrent delete of another key, so it retries a few
// times.
func (b *Bucket) install(tmp, p, key string, absent bool) error {
	dir := filepath.Dir(p)
	var err error
	for attempt := range 6 {
		if attempt > 0 {
			if err = os.MkdirAll(dir, 0o755); err != nil {
				if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, fs.ErrExist) {
					return fmt.Errorf("%w: a parent of %q is an object (a file on disk)", objstore.ErrInvalidKey, key)
				}
				return fmt.Errorf("create directory for %s: %w", key, err)
			}
		}
		var swapped bool
		if absent {
			// Nothing to swap with: a plain rename, which also fails
			// (EISDIR, ENOTEMPTY) rather than replace a directory.
			err = os.Rename(tmp, p)
		} else {
			swapped, err = replace(tmp, p)
		}
		if errors.Is(err, syscall.EXDEV) {
			// dir is on another file system than the bucket root.
			swapped, err = copyReplace(tmp, dir, p)
		}
		if err == nil {
			if swapped {
				b.keepSpare(tmp)
			}
			return nil
		}
		if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
			break
		}
	}
	if st, serr := os.Stat(p); serr == nil && st.IsDir() {
		return fmt.Errorf("%w: %q is a prefix of other objects (a directory on disk)", objstore.ErrInvalidKey, key)
	}
	return fmt.Errorf("rename into %s: %w", key, err)
}

// copyReplace copies tmp into a new temp file in dir and moves that to p.
func copyReplace(tmp, dir, p string) (bool, error) {
	src, err := os.Open(tmp)
	if err != nil {
		return false, err
	}
	defer src.Close()
	dst, err := os.CreateTemp(dir, TempPrefix+"*")
	if err != nil {
		return false, err
	}
	_, err = io.Copy(dst, src)
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(dst.Name(), 0o644)
	}
	var swapped bool
	if err == nil {
		swapped, err = replace(dst.Name(), p)
	}
	if err != nil || swapped {
		os.Remove(dst.Name())
	}
	if err == nil {
		os.Remove(tmp)
	}
	return false, err
}

// openBody opens the body at p with a shared flock and makes sure it is
// still the file at p (not a replaced body being reused for another write).
func openBody(key, p string) (*os.File, fs.FileInfo, error) {
	for range 100 {
		f, err := os.Open(p)
		if err != nil {
			return nil, nil, notFound(key, err)
		}
		for {
			err = syscall.Flock(int(f.Fd()), syscall.LOCK_SH)
			if !errors.Is(err, syscall.EINTR) {
				break
			}
		}
		if err != nil {
			f.Close()
			return nil, nil, fmt.Errorf("lock %s: %w", key, err)
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, nil, fmt.Errorf("stat %s: %w", key, err)
		}
		st, err := os.Stat(p)
		if err != nil {
			f.Close()
			return nil, nil, notFound(key, err)
		}
		if os.SameFile(fi, st) {
			return f, fi, nil
		}
		f.Close() // replaced meanwhile; open the new body
	}
	return nil, nil, fmt.Errorf("open %s: replaced too often while opening", key)
}

// removeFile unlinks name; a missing file is not an error.
func removeFile(name string) error {
	err := syscall.Unlink(name)
	if err == nil || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) {
		return nil
	}
	return &fs.PathError{Op: "remove", Path: name, Err: err}
}
