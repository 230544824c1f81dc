package fsbucket

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nstance-dev/nstance/pkg/objstore"
)

const (
	// HiddenDir is the top-level directory that holds sidecars and locks.
	HiddenDir = ".dev-s3"
	// TempPrefix starts the name of every in-flight temp file.
	TempPrefix = ".dev-s3-tmp-"

	lockStripes = 256
	metaSuffix  = ".meta"

	// sidecarMinSize is the body size from which the MD5 is kept in a
	// sidecar even without metadata; smaller bodies are hashed on read,
	// which costs less than writing and reading a second file.
	sidecarMinSize = 64 << 10
)

// Conditions makes a write conditional.
type Conditions struct {
	IfNoneMatch bool   // create only
	IfMatch     string // replace only when the current MD5 ETag equals this
}

// Info describes one stored object.
type Info struct {
	Key     string
	Size    int64
	ModTime time.Time
	// ETag is the hex MD5 of the body (unquoted).
	ETag string
	// Meta is the metadata stored with the object (for dev-s3: content type,
	// user metadata); nil when none was stored.
	Meta map[string]string
}

// Entry is one listed object before its ETag is looked up.
type Entry struct {
	Key     string
	Size    int64
	ModTime time.Time
}

// Bucket is a directory used as a bucket. It holds no open files and needs
// no Close.
type Bucket struct {
	root string
	// sync makes writes and deletes durable before they return (fsync of
	// the body, the sidecar and every directory they touched).
	sync bool
	// fsync syncs one file or directory; (*os.File).Sync except in tests.
	fsync func(*os.File) error

	// spares holds paths in .dev-s3/spare of replaced bodies kept for
	// reuse as the next write's temp file (see spare.go).
	mu     sync.Mutex
	spares []string
}

// Options tune a Bucket.
type Options struct {
	// Sync makes every Put and Delete durable before it returns: the body
	// and sidecar are fsynced before their rename, and the directories
	// whose entries changed (up to the root) after it. dev-s3 leaves it off
	// (a development simulator, tuned for speed); the server's file
	// storage backend turns it on.
	Sync bool
}

// Open is OpenWith with default Options.
func Open(dir string) (*Bucket, error) { return OpenWith(dir, Options{}) }

// OpenWith prepares dir as a bucket. A missing dir is created (mode 0o755, with
// missing parents). It fails with a clear error when dir cannot be created,
// is not a directory, or is not writable.
func OpenWith(dir string, o Options) (*Bucket, error) {
	if dir == "" {
		return nil, errors.New("bucket directory is empty")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("resolve bucket directory %q: %w", dir, err)
	}
	st, err := os.Stat(abs)
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		if err := os.MkdirAll(abs, 0o755); err != nil {
			return nil, fmt.Errorf("create bucket directory %s: %w", abs, err)
		}
	case err != nil:
		return nil, fmt.Errorf("stat bucket directory %s: %w", abs, err)
	case !st.IsDir():
		return nil, fmt.Errorf("bucket directory %s exists but is not a directory", abs)
	}
	probe, err := os.CreateTemp(abs, TempPrefix+"probe-*")
	if err != nil {
		return nil, fmt.Errorf("bucket directory %s is not writable: %w", abs, err)
	}
	probe.Close()
	if err := os.Remove(probe.Name()); err != nil {
		return nil, fmt.Errorf("bucket directory %s: remove probe file: %w", abs, err)
	}
	for _, sub := range []string{"meta", "locks", spareDir} {
		if err := os.MkdirAll(filepath.Join(abs, HiddenDir, sub), 0o755); err != nil {
			return nil, fmt.Errorf("bucket directory %s: create %s: %w", abs, filepath.Join(HiddenDir, sub), err)
		}
	}
	return &Bucket{root: abs, sync: o.Sync, fsync: (*os.File).Sync}, nil
}

// syncPath fsyncs the file or directory at path when the bucket is durable.
func (b *Bucket) syncPath(path string) error {
	if !b.sync {
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return b.fsync(f)
}

// syncDirs fsyncs dir and each parent up to the bucket root, so renamed,
// removed and newly created entries survive a crash.
func (b *Bucket) syncDirs(dir string) error {
	if !b.sync {
		return nil
	}
	for {
		if err := b.syncPath(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("sync directory %s: %w", dir, err)
		}
		if dir == b.root || len(dir) <= len(b.root) {
			return nil
		}
		dir = filepath.Dir(dir)
	}
}

// Root returns the absolute bucket directory.
func (b *Bucket) Root() string { return b.root }

// ValidateKey applies objstore.ValidateKey plus the rules that keep a key a
// plain file path inside the bucket: no "." segment, no trailing slash, no
// backslash, and none of the reserved names (.dev-s3 at the top, temp file
// prefix anywhere). The error wraps objstore.ErrInvalidKey.
func ValidateKey(key string) error {
	if err := objstore.ValidateKey(key); err != nil {
		return err
	}
	if strings.HasSuffix(key, "/") {
		return fmt.Errorf("%w: %q ends with a slash (directory markers are not stored)", objstore.ErrInvalidKey, key)
	}
	if strings.ContainsRune(key, '\\') {
		return fmt.Errorf("%w: %q contains a backslash", objstore.ErrInvalidKey, key)
	}
	segs := strings.Split(key, "/")
	if segs[0] == HiddenDir {
		return fmt.Errorf("%w: %q is inside the reserved %s directory", objstore.ErrInvalidKey, key, HiddenDir)
	}
	for _, s := range segs {
		if s == "." {
			return fmt.Errorf("%w: %q contains a \".\" segment", objstore.ErrInvalidKey, key)
		}
		if strings.HasPrefix(s, TempPrefix) {
			return fmt.Errorf("%w: %q uses the reserved prefix %s", objstore.ErrInvalidKey, key, TempPrefix)
		}
	}
	return nil
}

// path maps a validated key to its file, refusing anything outside root.
func (b *Bucket) path(key string) (string, error) {
	if err := ValidateKey(key); err != nil {
		return "", err
	}
	p := filepath.Join(b.root, filepath.FromSlash(key))
	if !strings.HasPrefix(p, b.root+string(filepath.Separator)) {
		return "", fmt.Errorf("%w: %q resolves outside the bucket", objstore.ErrInvalidKey, key)
	}
	return p, nil
}

func (b *Bucket) metaPath(key string) string {
	return filepath.Join(b.root, HiddenDir, "meta", filepath.FromSlash(key)+metaSuffix)
}

// sidecar is the JSON stored next to each object written through a Bucket.
type sidecar struct {
	Ino     uint64            `json:"ino"`
	Size    int64             `json:"size"`
	MtimeNs int64             `json:"mtimeNs"`
	MD5     string            `json:"md5"`
	Meta    map[string]string `json:"meta,omitempty"`
}

func identity(fi fs.FileInfo) (ino uint64, size, mtime int64) {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		ino = st.Ino
	}
	return ino, fi.Size(), fi.ModTime().UnixNano()
}

func (s *sidecar) matches(fi fs.FileInfo) bool {
	ino, size, mtime := identity(fi)
	return s.Ino == ino && s.Size == size && s.MtimeNs == mtime
}

func (b *Bucket) readSidecar(key string) *sidecar {
	data, err := os.ReadFile(b.metaPath(key))
	if err != nil {
		return nil
	}
	var sc sidecar
	if json.Unmarshal(data, &sc) != nil {
		return nil
	}
	return &sc
}

// lock takes the stripe lock for key; the returned func releases it.
func (b *Bucket) lock(ctx context.Context, key string) (func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	h := fnv.New32a()
	h.Write([]byte(key))
	name := filepath.Join(b.root, HiddenDir, "locks", fmt.Sprintf("%02x", h.Sum32()%lockStripes))
	f, err := os.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", name, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// Open opens the object's body for reading. The caller must close the file.
func (b *Bucket) Open(ctx context.Context, key string) (*os.File, Info, error) {
	p, err := b.path(key)
	if err != nil {
		return nil, Info{}, err
	}
	f, fi, err := openBody(key, p)
	if err != nil {
		return nil, Info{}, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, Info{}, fmt.Errorf("%w: %s", objstore.ErrNotFound, key)
	}
	info, err := b.describe(key, fi, f)
	if err != nil {
		f.Close()
		return nil, Info{}, err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, Info{}, fmt.Errorf("rewind %s: %w", key, err)
	}
	return f, info, nil
}

// Stat returns the object's Info, or an error wrapping objstore.ErrNotFound.
func (b *Bucket) Stat(ctx context.Context, key string) (Info, error) {
	p, err := b.path(key)
	if err != nil {
		return Info{}, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return Info{}, notFound(key, err)
	}
	if !fi.Mode().IsRegular() {
		return Info{}, fmt.Errorf("%w: %s", objstore.ErrNotFound, key)
	}
	return b.describe(key, fi, nil)
}

// describe builds Info from the sidecar when it matches the body, hashing
// the body otherwise (f may be nil; then the file is opened by path).
func (b *Bucket) describe(key string, fi fs.FileInfo, f *os.File) (Info, error) {
	info := Info{Key: key, Size: fi.Size(), ModTime: fi.ModTime()}
	sc := b.readSidecar(key)
	if sc != nil {
		info.Meta = sc.Meta
		if sc.matches(fi) {
			info.ETag = sc.MD5
			return info, nil
		}
	}
	if f == nil {
		p, _ := b.path(key)
		var err error
		if f, fi, err = openBody(key, p); err != nil {
			return Info{}, err
		}
		defer f.Close()
		info.Size, info.ModTime = fi.Size(), fi.ModTime()
		if sc != nil && sc.matches(fi) {
			info.ETag = sc.MD5
			return info, nil
		}
	}
	h := md5.New()
	if _, err := copyPooled(h, f); err != nil {
		return Info{}, fmt.Errorf("hash %s: %w", key, err)
	}
	info.ETag = hex.EncodeToString(h.Sum(nil))
	return info, nil
}

// copyBufs are the buffers of copyPooled: io.Copy allocated 32 KiB per
// object written or hashed, a third of all the bytes a registration
// allocated in bench/registration.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// copyPooled is io.Copy with a pooled buffer. src is hidden behind a plain
// Reader so an *os.File source does not take its WriteTo path (which
// allocates a buffer of its own for a non-socket destination).
func copyPooled(dst io.Writer, src io.Reader) (int64, error) {
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	return io.CopyBuffer(dst, struct{ io.Reader }{src}, *buf)
}

func notFound(key string, err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return fmt.Errorf("%w: %s", objstore.ErrNotFound, key)
	}
	return fmt.Errorf("open %s: %w", key, err)
}

// Put writes body as key, atomically and under the key's lock, checking
// cond first. It returns the stored object's Info.
func (b *Bucket) Put(ctx context.Context, key string, body io.Reader, meta map[string]string, cond Conditions) (Info, error) {
	p, err := b.path(key)
	if err != nil {
		return Info{}, err
	}
	unlock, err := b.lock(ctx, key)
	if err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	defer unlock()

	absent := false
	if cond.IfNoneMatch || cond.IfMatch != "" {
		if absent, err = b.check(ctx, key, cond); err != nil {
			return Info{}, err
		}
	}

	tmp, err := b.takeSpare()
	if err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	committed := false
	defer func() {
		if !committed {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	h := md5.New()
	n, err := copyPooled(io.MultiWriter(tmp, h), body)
	if err != nil {
		return Info{}, fmt.Errorf("write %s: %w", key, err)
	}
	fi, err := tmp.Stat()
	if err != nil {
		return Info{}, fmt.Errorf("stat %s: %w", key, err)
	}
	if fi.Size() > n { // a reused spare that held a longer body
		if err := tmp.Truncate(n); err != nil {
			return Info{}, fmt.Errorf("truncate %s: %w", key, err)
		}
		if fi, err = tmp.Stat(); err != nil {
			return Info{}, fmt.Errorf("stat %s: %w", key, err)
		}
	}
	if fi.Mode().Perm() != 0o644 {
		if err := tmp.Chmod(0o644); err != nil {
			return Info{}, fmt.Errorf("chmod %s: %w", key, err)
		}
	}
	if b.sync {
		if err := b.fsync(tmp); err != nil {
			return Info{}, fmt.Errorf("sync %s: %w", key, err)
		}
	}
	// Closing drops the spare's exclusive flock; no reader can reach the
	// file before it is renamed into place.
	if err := tmp.Close(); err != nil {
		return Info{}, fmt.Errorf("close %s: %w", key, err)
	}
	ino, size, mtime := identity(fi)
	sum := hex.EncodeToString(h.Sum(nil))
	// The sidecar goes first and names the new body's inode, so a reader
	// never pairs the new body with an old MD5: until the rename it still
	// sees the old body, whose identity does not match. Without metadata a
	// small body needs no sidecar; an old one is removed first.
	if len(meta) > 0 || size >= sidecarMinSize {
		if err := b.writeSidecar(key, &sidecar{Ino: ino, Size: size, MtimeNs: mtime, MD5: sum, Meta: meta}); err != nil {
			return Info{}, err
		}
	} else if err := removeFile(b.metaPath(key)); err != nil {
		return Info{}, fmt.Errorf("remove stale metadata of %s: %w", key, err)
	}
	if err := b.install(tmp.Name(), p, key, absent); err != nil {
		return Info{}, err
	}
	committed = true
	if err := b.syncDirs(filepath.Dir(p)); err != nil {
		return Info{}, fmt.Errorf("put %s: %w", key, err)
	}
	return Info{Key: key, Size: size, ModTime: fi.ModTime(), ETag: sum, Meta: meta}, nil
}

// check evaluates cond against the current object; the caller holds the lock.
// absent reports that there is no object at key (so the body can be moved
// into place without looking again).
func (b *Bucket) check(ctx context.Context, key string, cond Conditions) (absent bool, err error) {
	if cond.IfMatch == "" {
		// Create only: whether an object exists is enough, its ETag is not
		// needed (as Stat: only a regular file is an object).
		p, err := b.path(key)
		if err != nil {
			return false, err
		}
		fi, err := os.Lstat(p)
		switch {
		case err == nil && fi.Mode().IsRegular():
			return false, fmt.Errorf("%w: %s already exists", objstore.ErrPreconditionFailed, key)
		case err == nil:
			return false, nil // a directory (a prefix of other keys): install reports it
		case errors.Is(err, fs.ErrNotExist):
			return true, nil
		case errors.Is(err, syscall.ENOTDIR):
			return false, nil // a parent is an object: install reports it
		}
		return false, fmt.Errorf("stat %s: %w", key, err)
	}
	info, err := b.Stat(ctx, key)
	exists := err == nil
	if err != nil && !errors.Is(err, objstore.ErrNotFound) {
		return false, err
	}
	if cond.IfNoneMatch && exists {
		return false, fmt.Errorf("%w: %s already exists", objstore.ErrPreconditionFailed, key)
	}
	want := strings.Trim(cond.IfMatch, `"`)
	if !exists {
		return false, fmt.Errorf("%w: %s does not exist", objstore.ErrPreconditionFailed, key)
	}
	if want != "*" && want != info.ETag {
		return false, fmt.Errorf("%w: %s has ETag %s, not %s", objstore.ErrPreconditionFailed, key, info.ETag, want)
	}
	return false, nil
}

// createTemp creates a temp file in dir, creating dir when needed. A parent
// may be pruned by a concurrent delete between MkdirAll and CreateTemp, so
// it retries a few times.
func (b *Bucket) createTemp(dir, key string) (*os.File, error) {
	var lastErr error
	for range 5 {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, fs.ErrExist) {
				return nil, fmt.Errorf("%w: a parent of %q is an object (a file on disk)", objstore.ErrInvalidKey, key)
			}
			return nil, fmt.Errorf("create directory for %s: %w", key, err)
		}
		f, err := os.CreateTemp(dir, TempPrefix+"*")
		if err == nil {
			return f, nil
		}
		lastErr = err
		if !errors.Is(err, fs.ErrNotExist) {
			break
		}
	}
	return nil, fmt.Errorf("create temp file for %s: %w", key, lastErr)
}

func (b *Bucket) writeSidecar(key string, sc *sidecar) error {
	data, err := json.Marshal(sc)
	if err != nil {
		return fmt.Errorf("encode metadata for %s: %w", key, err)
	}
	mp := b.metaPath(key)
	tmp, err := b.createTemp(filepath.Dir(mp), key)
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("write metadata for %s: %w", key, err)
	}
	if b.sync {
		if err := b.fsync(tmp); err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
			return fmt.Errorf("sync metadata for %s: %w", key, err)
		}
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("close metadata for %s: %w", key, err)
	}
	if err := os.Rename(tmp.Name(), mp); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("store metadata for %s: %w", key, err)
	}
	return b.syncDirs(filepath.Dir(mp))
}

// Delete removes key and its sidecar, then prunes empty parent directories.
// Deleting a missing key is not an error.
func (b *Bucket) Delete(ctx context.Context, key string) error {
	p, err := b.path(key)
	if err != nil {
		return err
	}
	unlock, err := b.lock(ctx, key)
	if err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	defer unlock()
	if st, err := os.Lstat(p); err == nil && st.IsDir() {
		return nil // a prefix of other keys, not an object
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	mp := b.metaPath(key)
	if err := os.Remove(mp); err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
		return fmt.Errorf("delete metadata of %s: %w", key, err)
	}
	b.prune(filepath.Dir(p), b.root)
	b.prune(filepath.Dir(mp), filepath.Join(b.root, HiddenDir, "meta"))
	if err := b.syncDirs(filepath.Dir(p)); err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return b.syncDirs(filepath.Dir(mp))
}

// prune removes empty directories from dir up to (not including) stop.
func (b *Bucket) prune(dir, stop string) {
	for dir != stop && strings.HasPrefix(dir, stop+string(filepath.Separator)) {
		if os.Remove(dir) != nil {
			return
		}
		dir = filepath.Dir(dir)
	}
}

// List returns every object whose key starts with prefix, sorted by key.
// ETags are not computed; use Stat for the ones you need.
func (b *Bucket) List(ctx context.Context, prefix string) ([]Entry, error) {
	start := b.root
	if i := strings.LastIndex(prefix, "/"); i > 0 {
		if d := prefix[:i]; ValidateKey(d) == nil {
			start = filepath.Join(b.root, filepath.FromSlash(d))
		}
	}
	var out []Entry
	err := filepath.WalkDir(start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == start && errors.Is(err, fs.ErrNotExist) {
				return fs.SkipAll
			}
			if errors.Is(err, fs.ErrNotExist) {
				return nil // removed while walking
			}
			return err
		}
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		name := d.Name()
		if d.IsDir() {
			if p != b.root && filepath.Dir(p) == b.root && name == HiddenDir {
				return fs.SkipDir
			}
			return nil
		}
		if strings.HasPrefix(name, TempPrefix) || !d.Type().IsRegular() {
			return nil
		}
		rel, err := filepath.Rel(b.root, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if !strings.HasPrefix(key, prefix) {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		out = append(out, Entry{Key: key, Size: fi.Size(), ModTime: fi.ModTime()})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list %q: %w", prefix, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}
