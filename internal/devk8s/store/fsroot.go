package store

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/api/validate/content"
)

// Every file operation of the store goes through an os.Root opened on the
// data directory: a path that resolves outside it (a symlinked directory or
// file pointing elsewhere, a name with "..") fails instead of being
// followed. Symlinks are not followed at all when scanning: objects are
// regular files in real directories.

// Objects (Secrets among them) are nobody else's business: the store
// creates directories 0700 and files 0600, and at start takes group and
// other permissions off everything already in the data directory.
const (
	dirMode  fs.FileMode = 0o700
	fileMode fs.FileMode = 0o600
)

// tightenModes removes group and other permissions from every directory and
// regular file under root (older dev-k8s versions wrote 0644 files in 0755
// directories; scripts and editors create files with the umask's modes).
// Symlinks are neither followed nor changed. It returns how many it changed.
func tightenModes(root *os.Root) (int, error) {
	n := 0
	err := fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		perm := info.Mode().Perm()
		if perm&0o077 == 0 {
			return nil
		}
		if err := root.Chmod(p, perm&^0o077); err != nil {
			return fmt.Errorf("restrict %s to its owner: %w", p, err)
		}
		n++
		return nil
	})
	return n, err
}

// ErrInvalidName is returned for a namespace or name that cannot be a file
// name under the data directory.
var ErrInvalidName = errors.New("invalid name for a data directory file")

// maxNameLen is the longest object name that still fits a file name
// (NAME_MAX 255 minus ".json").
const maxNameLen = 255 - len(".json")

// CheckSegment reports why s cannot be a namespace directory or object file
// name: empty, "." or "..", containing "/" or "%" (kube-apiserver's path
// segment rule), starting with "." (hidden files are ignored), or too long.
func CheckSegment(s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: empty", ErrInvalidName)
	case len(content.IsPathSegmentName(s)) > 0:
		return fmt.Errorf("%w: %q: %s", ErrInvalidName, s, strings.Join(content.IsPathSegmentName(s), "; "))
	case strings.HasPrefix(s, "."):
		return fmt.Errorf("%w: %q starts with '.'", ErrInvalidName, s)
	case strings.ContainsAny(s, "\x00\\"):
		return fmt.Errorf("%w: %q contains NUL or a backslash", ErrInvalidName, s)
	case len(s) > maxNameLen:
		return fmt.Errorf("%w: %q is longer than %d characters, the most a file name can hold", ErrInvalidName, s, maxNameLen)
	}
	return nil
}

// checkSegments checks an object's namespace (when namespaced) and name.
func checkSegments(ns, name string) error {
	if ns != "" {
		if err := CheckSegment(ns); err != nil {
			return err
		}
	}
	return CheckSegment(name)
}

// rel turns a path under the data directory into one relative to the root.
func (s *Store) rel(p string) (string, error) {
	r, err := filepath.Rel(s.opts.Dir, p)
	if err != nil || r == ".." || strings.HasPrefix(r, ".."+string(filepath.Separator)) || filepath.IsAbs(r) {
		return "", fmt.Errorf("%s is outside the data directory %s", p, s.opts.Dir)
	}
	return r, nil
}

func (s *Store) readFile(p string) ([]byte, error) {
	r, err := s.rel(p)
	if err != nil {
		return nil, err
	}
	return s.root.ReadFile(r)
}

func (s *Store) lstat(p string) (fs.FileInfo, error) {
	r, err := s.rel(p)
	if err != nil {
		return nil, err
	}
	return s.root.Lstat(r)
}

func (s *Store) readDir(p string) ([]fs.DirEntry, error) {
	r, err := s.rel(p)
	if err != nil {
		return nil, err
	}
	f, err := s.root.Open(r)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.ReadDir(-1)
}

func (s *Store) mkdirAll(p string) error {
	r, err := s.rel(p)
	if err != nil {
		return err
	}
	return s.root.MkdirAll(r, dirMode)
}

func (s *Store) remove(p string) error {
	r, err := s.rel(p)
	if err != nil {
		return err
	}
	return s.root.Remove(r)
}

// writeAtomic writes through a temporary file and a rename, so readers
// (and fsnotify) never see a half-written file. tmpDir, on the same file
// system, holds the temporary files (a small directory keeps file creation
// cheap); empty means the target's directory.
func (s *Store) writeAtomic(p, tmpDir string, data []byte) error {
	target, err := s.rel(p)
	if err != nil {
		return err
	}
	dir := filepath.Dir(target)
	if err := s.root.MkdirAll(dir, dirMode); err != nil {
		return fmt.Errorf("create %s: %w", filepath.Join(s.opts.Dir, dir), err)
	}
	tdir := dir
	if tmpDir != "" {
		if tdir, err = s.rel(tmpDir); err != nil {
			return err
		}
	}
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return fmt.Errorf("temporary file name: %w", err)
	}
	tmp := filepath.Join(tdir, "."+filepath.Base(target)+".tmp"+hex.EncodeToString(rnd[:]))
	f, err := s.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fileMode)
	if err != nil {
		return fmt.Errorf("create temporary file for %s: %w", p, err)
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		_ = s.root.Remove(tmp)
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		_ = s.root.Remove(tmp)
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := s.root.Rename(tmp, target); err != nil {
		_ = s.root.Remove(tmp)
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	return nil
}
