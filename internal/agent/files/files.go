package files

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/nstance-dev/nstance/internal/atomicfile"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Limits used when Options leaves them unset.
const (
	DefaultMaxSize  = 1 << 20
	DefaultFileMode = 0o644
	DefaultDirMode  = 0o755
	// SecretMode is used for secrets delivered without a mode.
	SecretMode = 0o600
	// MaxFileMode caps the mode of every non-secret file: nobody but the
	// owner may write it (no group- or world-writable files).
	MaxFileMode = 0o755
	// MaxSecretMode caps the mode of secrets: owner only.
	MaxSecretMode = 0o600
	// maxPathLen bounds the length of a delivered path.
	maxPathLen = 1024
)

// Options configure a Writer.
type Options struct {
	// MaxSize is the largest accepted content in bytes (default 1 MiB).
	MaxSize int64
	// FileMode is used for non-secret files delivered with mode 0; it may
	// not be group- or world-writable.
	FileMode fs.FileMode
	// DirMode is used for directories the writer creates; it may not be
	// group- or world-writable.
	DirMode fs.FileMode
	// ManifestPath is the file, outside the files directory, listing the
	// paths the writer put in it, so files dropped from the template are
	// removed also after an agent restart. Default: ".<dir name>.manifest.json"
	// beside the directory.
	ManifestPath string
}

// Writer writes delivered files below one directory. It is safe for
// concurrent use; writes are serialised.
type Writer struct {
	dir  string
	opts Options

	mu     sync.Mutex
	status map[string]*nstancev1.FileStatus
	// written are the paths this writer (or a previous run) put on disk.
	written map[string]bool
}

// New returns a Writer for dir, creating dir (mode DirMode) when missing.
func New(dir string, opts Options) (*Writer, error) {
	if dir == "" {
		return nil, errors.New("files: directory is required")
	}
	if opts.MaxSize <= 0 {
		opts.MaxSize = DefaultMaxSize
	}
	if opts.FileMode == 0 {
		opts.FileMode = DefaultFileMode
	}
	if opts.DirMode == 0 {
		opts.DirMode = DefaultDirMode
	}
	if opts.FileMode&^fs.ModePerm != 0 || opts.DirMode&^fs.ModePerm != 0 {
		return nil, fmt.Errorf("files: modes must be permission bits only (file %o, dir %o)", opts.FileMode, opts.DirMode)
	}
	if opts.FileMode&0o022 != 0 || opts.DirMode&0o022 != 0 {
		return nil, fmt.Errorf("files: modes must not be group- or world-writable (file %#o, dir %#o)", opts.FileMode, opts.DirMode)
	}
	if opts.ManifestPath == "" {
		clean := filepath.Clean(dir)
		opts.ManifestPath = filepath.Join(filepath.Dir(clean), "."+filepath.Base(clean)+".manifest.json")
	}
	if err := os.MkdirAll(dir, opts.DirMode); err != nil {
		return nil, fmt.Errorf("files: creating %s: %w", dir, err)
	}
	w := &Writer{dir: dir, opts: opts, status: map[string]*nstancev1.FileStatus{}, written: map[string]bool{}}
	w.loadManifest()
	return w, nil
}

type manifest struct {
	Paths []string `json:"paths"`
}

// loadManifest reads the paths written by a previous run. An unreadable or
// corrupt manifest is treated as empty (nothing is removed on its account);
// entries that are not clean relative paths are ignored.
func (w *Writer) loadManifest() {
	b, err := os.ReadFile(w.opts.ManifestPath)
	if err != nil {
		return
	}
	var m manifest
	if json.Unmarshal(b, &m) != nil {
		return
	}
	for _, p := range m.Paths {
		if rel, err := CleanPath(p); err == nil {
			w.written[rel] = true
		}
	}
}

func (w *Writer) saveManifest() error {
	m := manifest{Paths: make([]string, 0, len(w.written))}
	for p := range w.written {
		m.Paths = append(m.Paths, p)
	}
	sort.Strings(m.Paths)
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return atomicfile.WritePath(w.opts.ManifestPath, b, 0o600)
}

// Dir is the directory files are written into.
func (w *Writer) Dir() string { return w.dir }

// Apply writes every file of a delivery. A file that fails validation or
// writing is skipped (whatever was on disk at its path stays untouched) and
// recorded with FILE_STATE_ERROR; the others are still written. A delivery is
// the instance's complete file set: files this writer put on disk earlier
// that are neither delivered nor pending (d.PendingPaths) were dropped from
// the template and are removed, inside the directory only and never through
// a symbolic link. It returns the status of each file in delivery order.
func (w *Writer) Apply(d *nstancev1.FileDelivery) []*nstancev1.FileStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]*nstancev1.FileStatus, 0, len(d.GetFiles()))
	keep := map[string]bool{}
	for _, f := range d.GetFiles() {
		st := &nstancev1.FileStatus{Path: f.GetPath(), State: nstancev1.FileState_FILE_STATE_OK}
		sum, err := w.write(f)
		if err != nil {
			st.State = nstancev1.FileState_FILE_STATE_ERROR
			st.Message = err.Error()
		} else {
			st.Sha256 = sum
		}
		if rel, err := CleanPath(f.GetPath()); err == nil {
			keep[rel] = true
			if st.State == nstancev1.FileState_FILE_STATE_OK {
				w.written[rel] = true
			}
		}
		w.status[statusKey(f.GetPath())] = st
		out = append(out, st)
	}
	for _, p := range d.GetPendingPaths() {
		if rel, err := CleanPath(p); err == nil {
			keep[rel] = true
		}
	}
	w.removeDropped(keep)
	return out
}

// removeDropped removes every written path not in keep and saves the
// manifest. A path that cannot be removed stays listed (and in the status as
// an error) so the next delivery tries again.
func (w *Writer) removeDropped(keep map[string]bool) {
	root, err := os.OpenRoot(w.dir)
	if err != nil {
		return // the next delivery tries again
	}
	defer root.Close()
	for rel := range w.written {
		if keep[rel] {
			continue
		}
		if err := removeFile(root, rel); err != nil {
			w.status[statusKey(rel)] = &nstancev1.FileStatus{Path: rel, State: nstancev1.FileState_FILE_STATE_ERROR,
				Message: fmt.Sprintf("dropped from the template but not removed: %v", err)}
			continue
		}
		delete(w.written, rel)
		delete(w.status, statusKey(rel))
	}
	_ = w.saveManifest() // a lost manifest only leaves dropped files behind
}

// removeFile removes the regular file rel and then the directories above it
// that became empty. Nothing is removed through a symbolic link: when any
// component of rel is a link, or rel is not a regular file, the entry is left
// alone and forgotten.
func removeFile(root *os.Root, rel string) error {
	parts := strings.Split(rel, "/")
	for i := range parts {
		sub := strings.Join(parts[:i+1], "/")
		fi, err := root.Lstat(sub)
		if errors.Is(err, fs.ErrNotExist) {
			return nil // already gone
		}
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 || (i < len(parts)-1 && !fi.IsDir()) || (i == len(parts)-1 && !fi.Mode().IsRegular()) {
			return nil // not ours to remove any more
		}
	}
	if err := root.Remove(rel); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	dir := path.Dir(rel)
	for dir != "." && root.Remove(dir) == nil { // stops at the first directory that is not empty
		dir = path.Dir(dir)
	}
	return atomicfile.SyncDir(root, dir)
}

// Status returns the latest status of every path delivered so far, sorted by path.
func (w *Writer) Status() []*nstancev1.FileStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	keys := make([]string, 0, len(w.status))
	for k := range w.status {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]*nstancev1.FileStatus, 0, len(keys))
	for _, k := range keys {
		s := w.status[k]
		out = append(out, &nstancev1.FileStatus{Path: s.Path, State: s.State, Message: s.Message, Sha256: s.Sha256})
	}
	return out
}

// statusKey keeps statuses of odd paths (empty, absolute) apart without
// letting them collide with real ones.
func statusKey(p string) string { return "\x00" + p }

// write validates and writes one file, returning the hex SHA-256 written.
func (w *Writer) write(f *nstancev1.DeliveredFile) (string, error) {
	rel, err := CleanPath(f.GetPath())
	if err != nil {
		return "", err
	}
	content := f.GetContent()
	if int64(len(content)) > w.opts.MaxSize {
		return "", fmt.Errorf("file %q is %d bytes, above the %d byte limit", rel, len(content), w.opts.MaxSize)
	}
	sum := sha256.Sum256(content)
	hexSum := hex.EncodeToString(sum[:])
	if want := strings.ToLower(f.GetSha256()); want != "" && want != hexSum {
		return "", fmt.Errorf("file %q: content hash %s does not match the announced %s", rel, hexSum, want)
	}
	mode, err := w.mode(f)
	if err != nil {
		return "", fmt.Errorf("file %q: %w", rel, err)
	}
	if err := checkContent(f.GetKind(), content); err != nil {
		return "", fmt.Errorf("file %q: %w", rel, err)
	}
	root, err := os.OpenRoot(w.dir)
	if err != nil {
		return "", fmt.Errorf("opening %s: %w", w.dir, err)
	}
	defer root.Close()
	if err := refuseSymlinks(root, rel); err != nil {
		return "", err
	}
	if parent := path.Dir(rel); parent != "." {
		if err := root.MkdirAll(parent, w.opts.DirMode); err != nil {
			return "", fmt.Errorf("file %q: creating parent directory: %w", rel, err)
		}
		// MkdirAll may have raced with someone planting a link; check again.
		if err := refuseSymlinks(root, rel); err != nil {
			return "", err
		}
	}
	if err := atomicfile.Write(root, rel, content, mode); err != nil {
		return "", fmt.Errorf("file %q: %w", rel, err)
	}
	return hexSum, nil
}

// mode decides the permission bits of a delivered file: the requested mode
// capped at MaxFileMode (MaxSecretMode for secrets), so no delivered file is
// ever group- or world-writable and no secret readable by anyone but the
// owner.
func (w *Writer) mode(f *nstancev1.DeliveredFile) (fs.FileMode, error) {
	m := fs.FileMode(f.GetMode())
	if m&^fs.ModePerm != 0 {
		return 0, fmt.Errorf("mode %#o has bits beyond the permission bits", f.GetMode())
	}
	secret := f.GetKind() == nstancev1.FileKind_FILE_KIND_SECRET
	if m == 0 {
		if secret {
			return SecretMode, nil
		}
		return w.opts.FileMode, nil
	}
	if m&0o400 == 0 {
		return 0, fmt.Errorf("mode %#o does not let the owner read the file", f.GetMode())
	}
	if secret {
		return m & MaxSecretMode, nil
	}
	return m & MaxFileMode, nil
}

// CleanPath checks a delivered path and returns it in clean, slash-separated
// form. Empty and absolute paths, ".." and "." components, backslashes and NUL
// bytes are refused.
func CleanPath(p string) (string, error) {
	switch {
	case p == "":
		return "", errors.New("empty path")
	case len(p) > maxPathLen:
		return "", fmt.Errorf("path of %d bytes is longer than %d", len(p), maxPathLen)
	case strings.HasPrefix(p, "/"):
		return "", fmt.Errorf("path %q is absolute", p)
	case strings.ContainsAny(p, "\\\x00"):
		return "", fmt.Errorf("path %q contains a backslash or NUL byte", p)
	}
	for _, part := range strings.Split(p, "/") {
		switch part {
		case "..":
			return "", fmt.Errorf("path %q contains \"..\"", p)
		case ".", "":
			return "", fmt.Errorf("path %q has an empty or \".\" component", p)
		}
	}
	return p, nil
}

// refuseSymlinks fails when any existing component of rel is a symbolic link.
func refuseSymlinks(root *os.Root, rel string) error {
	parts := strings.Split(rel, "/")
	for i := range parts {
		sub := strings.Join(parts[:i+1], "/")
		fi, err := root.Lstat(sub)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("file %q: checking %q: %w", rel, sub, err)
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("file %q: %q is a symbolic link", rel, sub)
		}
		if i < len(parts)-1 && !fi.IsDir() {
			return fmt.Errorf("file %q: %q is not a directory", rel, sub)
		}
		if i == len(parts)-1 && !fi.Mode().IsRegular() {
			return fmt.Errorf("file %q: existing entry is not a regular file", rel)
		}
	}
	return nil
}

// checkContent validates content against its declared kind.
func checkContent(kind nstancev1.FileKind, content []byte) error {
	switch kind {
	case nstancev1.FileKind_FILE_KIND_UNSPECIFIED:
		return errors.New("file kind is not set")
	case nstancev1.FileKind_FILE_KIND_JSON:
		if !json.Valid(content) {
			return errors.New("content is not valid JSON")
		}
	case nstancev1.FileKind_FILE_KIND_CERTIFICATE, nstancev1.FileKind_FILE_KIND_CA_BUNDLE:
		return checkPEMCerts(content)
	case nstancev1.FileKind_FILE_KIND_ENV:
		return checkEnv(content)
	case nstancev1.FileKind_FILE_KIND_SECRET, nstancev1.FileKind_FILE_KIND_STRING:
	default:
		return fmt.Errorf("unknown file kind %d", kind)
	}
	return nil
}

func checkPEMCerts(content []byte) error {
	rest := content
	n := 0
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return fmt.Errorf("PEM block %d is %q, want CERTIFICATE", n+1, b.Type)
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return fmt.Errorf("PEM block %d: %w", n+1, err)
		}
		n++
	}
	if n == 0 {
		return errors.New("content holds no PEM certificate")
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return errors.New("content has data after the last PEM certificate")
	}
	return nil
}

func checkEnv(content []byte) error {
	for i, line := range strings.Split(string(content), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		key, _, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok || !validEnvKey(key) {
			return fmt.Errorf("env line %d is not KEY=value", i+1)
		}
	}
	return nil
}

func validEnvKey(k string) bool {
	if k == "" {
		return false
	}
	for i, c := range k {
		alpha := c == '_' || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')
		if !alpha && !(i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
