package devs3

import (
	"crypto/md5"
	"crypto/rand"
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
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/johannesboyne/gofakes3"

	"github.com/nstance-dev/nstance/pkg/objstore/fsbucket"
)

// Multipart uploads live on disk, never in memory, under the bucket's hidden
// directory:
//
//	.dev-s3/uploads/<upload id>/upload.json          key, metadata, initiation time
//	.dev-s3/uploads/<upload id>/<nnnnn>-<md5>.part   one file per part (number and ETag in the name)
//	.dev-s3/uploads/<upload id>/.tmp-*               a part being received
//
// A part is streamed to a temp file while its MD5 is computed, then renamed
// into place; CompleteMultipartUpload streams the listed parts into the
// object through fsbucket.Put (a temp file renamed over the key). Uploads
// survive a restart; abandoned ones are removed after Config.UploadExpiry.

const (
	uploadsDir     = "uploads"
	uploadInfoFile = "upload.json"
	partSuffix     = ".part"
	uploadStripes  = 64
)

// uploadInfo is upload.json.
type uploadInfo struct {
	Key       string            `json:"key"`
	Meta      map[string]string `json:"meta,omitempty"`
	Initiated time.Time         `json:"initiated"`
}

// uploads manages the upload directories of one bucket.
type uploads struct {
	dir string
	// locks serialise part commits, completion, abort and expiry of an
	// upload (striped by upload ID).
	locks [uploadStripes]sync.Mutex
}

func newUploads(bucketRoot string) (*uploads, error) {
	dir := filepath.Join(bucketRoot, fsbucket.HiddenDir, uploadsDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	return &uploads{dir: dir}, nil
}

func (u *uploads) lock(id gofakes3.UploadID) func() {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	m := &u.locks[h.Sum32()%uploadStripes]
	m.Lock()
	return m.Unlock
}

// validID reports whether id has the form newID produces, so that it can
// never name anything but one directory under uploads/.
func validID(id gofakes3.UploadID) bool {
	if len(id) != 32 {
		return false
	}
	_, err := hex.DecodeString(string(id))
	return err == nil
}

func newID() (gofakes3.UploadID, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate upload id: %w", err)
	}
	return gofakes3.UploadID(hex.EncodeToString(b)), nil
}

func (u *uploads) path(id gofakes3.UploadID) string { return filepath.Join(u.dir, string(id)) }

func (u *uploads) create(key string, meta map[string]string, now time.Time) (gofakes3.UploadID, error) {
	id, err := newID()
	if err != nil {
		return "", err
	}
	dir := u.path(id)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", fmt.Errorf("create upload directory: %w", err)
	}
	data, err := json.Marshal(uploadInfo{Key: key, Meta: meta, Initiated: now.UTC()})
	if err != nil {
		return "", fmt.Errorf("encode upload: %w", err)
	}
	if err := writeFileAtomic(dir, uploadInfoFile, data); err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	return id, nil
}

// info reads an upload; ErrNoSuchUpload when it does not exist or belongs
// to another key.
func (u *uploads) info(id gofakes3.UploadID, key string) (uploadInfo, error) {
	var info uploadInfo
	if !validID(id) {
		return info, gofakes3.ErrNoSuchUpload
	}
	data, err := os.ReadFile(filepath.Join(u.path(id), uploadInfoFile))
	if errors.Is(err, fs.ErrNotExist) {
		return info, gofakes3.ErrNoSuchUpload
	}
	if err != nil {
		return info, fmt.Errorf("read upload %s: %w", id, err)
	}
	if err := json.Unmarshal(data, &info); err != nil {
		return info, fmt.Errorf("upload %s: %s is damaged: %w", id, uploadInfoFile, err)
	}
	if key != "" && info.Key != key {
		return info, gofakes3.ErrNoSuchUpload
	}
	return info, nil
}

// storedPart is one part file.
type storedPart struct {
	number   int
	etag     string // hex MD5
	size     int64
	modified time.Time
	file     string
}

// parts lists an upload's parts by number (the newest file wins should a
// replaced part's old file still be there).
func (u *uploads) parts(id gofakes3.UploadID) (map[int]storedPart, error) {
	ents, err := os.ReadDir(u.path(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, gofakes3.ErrNoSuchUpload
	}
	if err != nil {
		return nil, fmt.Errorf("read upload %s: %w", id, err)
	}
	out := map[int]storedPart{}
	for _, e := range ents {
		num, etag, ok := parsePartName(e.Name())
		if !ok {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		p := storedPart{number: num, etag: etag, size: info.Size(), modified: info.ModTime(), file: filepath.Join(u.path(id), e.Name())}
		if old, ok := out[num]; !ok || p.modified.After(old.modified) {
			out[num] = p
		}
	}
	return out, nil
}

func partName(num int, etag string) string { return fmt.Sprintf("%05d-%s%s", num, etag, partSuffix) }

func parsePartName(name string) (int, string, bool) {
	base, ok := strings.CutSuffix(name, partSuffix)
	if !ok {
		return 0, "", false
	}
	numText, etag, ok := strings.Cut(base, "-")
	if !ok || len(etag) != 32 {
		return 0, "", false
	}
	num, err := strconv.Atoi(numText)
	if err != nil || num < 1 || num > gofakes3.MaxUploadPartNumber {
		return 0, "", false
	}
	return num, etag, true
}

// putPart streams body (exactly size bytes) into the upload's directory
// and returns the part's quoted ETag.
func (u *uploads) putPart(id gofakes3.UploadID, key string, num int, size int64, body io.Reader) (string, error) {
	if _, err := u.info(id, key); err != nil {
		return "", err
	}
	dir := u.path(id)
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if errors.Is(err, fs.ErrNotExist) {
		return "", gofakes3.ErrNoSuchUpload // aborted or expired meanwhile
	}
	if err != nil {
		return "", fmt.Errorf("create part file: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // no-op once renamed
	h := md5.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), &exactReader{r: body, left: size})
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if errors.Is(err, gofakes3.ErrIncompleteBody) {
			return "", gofakes3.ErrIncompleteBody
		}
		var s3err gofakes3.Error
		if errors.As(err, &s3err) {
			return "", err
		}
		return "", fmt.Errorf("write part %d: %w", num, err)
	}
	if n != size {
		return "", gofakes3.ErrIncompleteBody
	}
	etag := hex.EncodeToString(h.Sum(nil))
	unlock := u.lock(id)
	defer unlock()
	if _, err := os.Stat(dir); err != nil {
		return "", gofakes3.ErrNoSuchUpload
	}
	old, err := u.parts(id)
	if err != nil {
		return "", err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, partName(num, etag))); err != nil {
		return "", fmt.Errorf("store part %d: %w", num, err)
	}
	if p, ok := old[num]; ok && p.etag != etag {
		_ = os.Remove(p.file) // the replaced part
	}
	return `"` + etag + `"`, nil
}

// complete assembles the listed parts into key by streaming them through
// put, then removes the upload.
func (u *uploads) complete(id gofakes3.UploadID, key string, listed []gofakes3.CompletedPart, put func(info uploadInfo, body io.Reader) (string, error)) (string, error) {
	unlock := u.lock(id)
	defer unlock()
	info, err := u.info(id, key)
	if err != nil {
		return "", err
	}
	if len(listed) == 0 {
		return "", gofakes3.ErrorMessage(gofakes3.ErrMalformedXML, "no parts listed")
	}
	have, err := u.parts(id)
	if err != nil {
		return "", err
	}
	var files []*os.File
	defer func() {
		for _, f := range files {
			_ = f.Close()
		}
	}()
	readers := make([]io.Reader, 0, len(listed))
	prev := 0
	for _, p := range listed {
		if p.PartNumber <= prev {
			return "", gofakes3.ErrInvalidPartOrder
		}
		prev = p.PartNumber
		sp, ok := have[p.PartNumber]
		if !ok || strings.Trim(p.ETag, `"`) != sp.etag {
			return "", gofakes3.ErrorMessagef(gofakes3.ErrInvalidPart, "part %d is missing or its ETag differs", p.PartNumber)
		}
		f, err := os.Open(sp.file)
		if err != nil {
			return "", fmt.Errorf("open part %d: %w", p.PartNumber, err)
		}
		files = append(files, f)
		readers = append(readers, f)
	}
	etag, err := put(info, io.MultiReader(readers...))
	if err != nil {
		return "", err
	}
	if err := os.RemoveAll(u.path(id)); err != nil {
		return etag, fmt.Errorf("remove completed upload %s: %w", id, err)
	}
	return etag, nil
}

func (u *uploads) abort(id gofakes3.UploadID, key string) error {
	unlock := u.lock(id)
	defer unlock()
	if _, err := u.info(id, key); err != nil {
		return err
	}
	if err := os.RemoveAll(u.path(id)); err != nil {
		return fmt.Errorf("remove upload %s: %w", id, err)
	}
	return nil
}

// listedUpload is one upload in a listing.
type listedUpload struct {
	id   gofakes3.UploadID
	info uploadInfo
}

// list returns every upload, sorted by key, then initiation, then ID.
func (u *uploads) list() ([]listedUpload, error) {
	ents, err := os.ReadDir(u.dir)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", u.dir, err)
	}
	var out []listedUpload
	for _, e := range ents {
		id := gofakes3.UploadID(e.Name())
		if !e.IsDir() || !validID(id) {
			continue
		}
		info, err := u.info(id, "")
		if err != nil {
			continue // being created, removed, or damaged (expiry removes it)
		}
		out = append(out, listedUpload{id: id, info: info})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.info.Key != b.info.Key {
			return a.info.Key < b.info.Key
		}
		if !a.info.Initiated.Equal(b.info.Initiated) {
			return a.info.Initiated.Before(b.info.Initiated)
		}
		return a.id < b.id
	})
	return out, nil
}

// expire removes uploads initiated before cutoff, and upload directories
// without a readable upload.json last changed before cutoff. It returns
// how many it removed.
func (u *uploads) expire(cutoff time.Time) (int, error) {
	ents, err := os.ReadDir(u.dir)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", u.dir, err)
	}
	removed := 0
	var errs []error
	for _, e := range ents {
		id := gofakes3.UploadID(e.Name())
		started := time.Time{}
		if info, err := u.info(id, ""); err == nil {
			started = info.Initiated
		} else if fi, err := e.Info(); err == nil {
			started = fi.ModTime()
		}
		if started.IsZero() || !started.Before(cutoff) {
			continue
		}
		unlock := u.lock(id)
		err := os.RemoveAll(filepath.Join(u.dir, e.Name()))
		unlock()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	return removed, errors.Join(errs...)
}

// writeFileAtomic writes dir/name through a temp file and a rename.
func writeFileAtomic(dir, name string, data []byte) error {
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	_, err = tmp.Write(data)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, name))
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}
