package devs3

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/johannesboyne/gofakes3"

	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/fsbucket"
)

// backend implements gofakes3.Backend and gofakes3.MultipartBackend for one
// bucket stored in an fsbucket.Bucket.
type backend struct {
	name    string
	store   *fsbucket.Bucket
	created time.Time

	uploads *uploads
	now     func() time.Time

	mu sync.Mutex
	// pending holds the conditions of CompleteMultipartUpload requests in
	// flight, keyed by upload ID (gofakes3 does not pass headers through).
	pending map[gofakes3.UploadID]fsbucket.Conditions
}

var (
	_ gofakes3.Backend          = (*backend)(nil)
	_ gofakes3.MultipartBackend = (*backend)(nil)
)

func newBackend(name string, store *fsbucket.Bucket, now func() time.Time) (*backend, error) {
	created := now()
	if st, err := os.Stat(store.Root()); err == nil {
		created = st.ModTime()
	}
	ups, err := newUploads(store.Root())
	if err != nil {
		return nil, err
	}
	return &backend{
		name:    name,
		store:   store,
		created: created,
		uploads: ups,
		now:     now,
		pending: map[gofakes3.UploadID]fsbucket.Conditions{},
	}, nil
}

// defaultContentType is served for objects stored without a content type.
const defaultContentType = "application/octet-stream"

// storedMeta keeps only the headers S3 returns with an object; request
// plumbing such as X-Amz-Date or checksum headers is dropped.
func storedMeta(in map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range in {
		switch {
		case k == "Content-Type" && v == defaultContentType:
			// The default needs no sidecar (SDKs send it when none is set).
		case k == "Content-Type", k == "Content-Disposition", k == "Content-Encoding", k == "Cache-Control",
			strings.HasPrefix(k, "X-Amz-Meta-"):
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// responseMeta is what GET and HEAD send back as headers.
func responseMeta(info fsbucket.Info) map[string]string {
	out := make(map[string]string, len(info.Meta)+1)
	for k, v := range info.Meta {
		out[k] = v
	}
	if _, ok := out["Content-Type"]; !ok {
		out["Content-Type"] = defaultContentType
	}
	out["Last-Modified"] = info.ModTime.UTC().Format(http.TimeFormat)
	return out
}

func hashBytes(etag string) []byte {
	b, err := hex.DecodeString(etag)
	if err != nil {
		return nil
	}
	return b
}

// s3err maps fsbucket/objstore errors to gofakes3 error responses.
func s3err(key string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, objstore.ErrNotFound):
		return gofakes3.KeyNotFound(key)
	case errors.Is(err, objstore.ErrPreconditionFailed):
		return gofakes3.ErrorMessage(gofakes3.ErrPreconditionFailed, err.Error())
	case errors.Is(err, objstore.ErrInvalidKey):
		return gofakes3.ErrorInvalidArgument("key", key, err.Error())
	}
	return err
}

func (b *backend) checkBucket(name string) error {
	if name != b.name {
		return gofakes3.BucketNotFound(name)
	}
	return nil
}

func (b *backend) ListBuckets() ([]gofakes3.BucketInfo, error) {
	return []gofakes3.BucketInfo{{Name: b.name, CreationDate: gofakes3.NewContentTime(b.created)}}, nil
}

// ListBucket implements S3 prefix/delimiter semantics and marker paging
// over the sorted keys of the directory.
func (b *backend) ListBucket(name string, prefix *gofakes3.Prefix, page gofakes3.ListBucketPage) (*gofakes3.ObjectList, error) {
	if err := b.checkBucket(name); err != nil {
		return nil, err
	}
	var pfx, delim string
	if prefix != nil {
		pfx, delim = prefix.Prefix, prefix.Delimiter
	}
	ctx := context.Background()
	entries, err := b.store.List(ctx, pfx)
	if err != nil {
		return nil, err
	}
	limit := page.MaxKeys
	if limit <= 0 {
		limit = gofakes3.DefaultMaxBucketKeys
	}
	out := gofakes3.NewObjectList()
	var count int64
	lastCommon := ""
	for _, e := range entries {
		item, isPrefix := e.Key, false
		if delim != "" {
			if i := strings.Index(e.Key[len(pfx):], delim); i >= 0 {
				item, isPrefix = e.Key[:len(pfx)+i+len(delim)], true
			}
		}
		if isPrefix && item == lastCommon {
			continue
		}
		if page.HasMarker && item <= page.Marker {
			continue
		}
		if count == limit {
			out.IsTruncated = true
			break
		}
		if isPrefix {
			lastCommon = item
			out.AddPrefix(item)
		} else {
			info, err := b.store.Stat(ctx, e.Key)
			if errors.Is(err, objstore.ErrNotFound) {
				continue // deleted since the walk
			} else if err != nil {
				return nil, err
			}
			out.Add(&gofakes3.Content{
				Key:          e.Key,
				LastModified: gofakes3.NewContentTime(info.ModTime),
				ETag:         `"` + info.ETag + `"`,
				Size:         info.Size,
				StorageClass: gofakes3.StorageStandard,
			})
		}
		out.NextMarker = item
		count++
	}
	if !out.IsTruncated {
		out.NextMarker = ""
	}
	return out, nil
}

func (b *backend) CreateBucket(name string) error {
	if name == b.name {
		return gofakes3.ResourceError(gofakes3.ErrBucketAlreadyExists, name)
	}
	return gofakes3.ErrorMessage(gofakes3.ErrNotImplemented, "dev-s3 serves a single bucket")
}

func (b *backend) BucketExists(name string) (bool, error) { return name == b.name, nil }

func (b *backend) DeleteBucket(name string) error {
	return gofakes3.ErrorMessage(gofakes3.ErrNotImplemented, "dev-s3 serves a single bucket")
}

func (b *backend) ForceDeleteBucket(name string) error { return b.DeleteBucket(name) }

func (b *backend) GetObject(bucket, key string, rng *gofakes3.ObjectRangeRequest) (*gofakes3.Object, error) {
	if err := b.checkBucket(bucket); err != nil {
		return nil, err
	}
	f, info, err := b.store.Open(context.Background(), key)
	if err != nil {
		return nil, s3err(key, err)
	}
	r, err := rng.Range(info.Size)
	if err != nil {
		f.Close()
		return nil, err
	}
	var body io.ReadCloser = f
	if r != nil {
		body = &sectionCloser{Reader: io.NewSectionReader(f, r.Start, r.Length), c: f}
	}
	return &gofakes3.Object{
		Name:     key,
		Metadata: responseMeta(info),
		Size:     info.Size,
		Contents: body,
		Hash:     hashBytes(info.ETag),
		Range:    r,
	}, nil
}

type sectionCloser struct {
	io.Reader
	c io.Closer
}

func (s *sectionCloser) Close() error { return s.c.Close() }

func (b *backend) HeadObject(bucket, key string) (*gofakes3.Object, error) {
	if err := b.checkBucket(bucket); err != nil {
		return nil, err
	}
	info, err := b.store.Stat(context.Background(), key)
	if err != nil {
		return nil, s3err(key, err)
	}
	return &gofakes3.Object{
		Name:     key,
		Metadata: responseMeta(info),
		Size:     info.Size,
		Contents: io.NopCloser(bytes.NewReader(nil)),
		Hash:     hashBytes(info.ETag),
	}, nil
}

func (b *backend) DeleteObject(bucket, key string) (gofakes3.ObjectDeleteResult, error) {
	if err := b.checkBucket(bucket); err != nil {
		return gofakes3.ObjectDeleteResult{}, err
	}
	return gofakes3.ObjectDeleteResult{}, s3err(key, b.store.Delete(context.Background(), key))
}

func conditionsFrom(c *gofakes3.PutConditions) (fsbucket.Conditions, error) {
	var out fsbucket.Conditions
	if c == nil {
		return out, nil
	}
	if c.IfNoneMatch != nil {
		if strings.TrimSpace(*c.IfNoneMatch) != "*" {
			return out, gofakes3.ErrorInvalidArgument("If-None-Match", *c.IfNoneMatch, "only If-None-Match: * is supported on writes")
		}
		out.IfNoneMatch = true
	}
	if c.IfMatch != nil {
		out.IfMatch = strings.TrimSpace(*c.IfMatch)
	}
	return out, nil
}

func (b *backend) PutObject(bucket, key string, meta map[string]string, input io.Reader, size int64, conditions *gofakes3.PutConditions) (gofakes3.PutObjectResult, error) {
	if err := b.checkBucket(bucket); err != nil {
		return gofakes3.PutObjectResult{}, err
	}
	cond, err := conditionsFrom(conditions)
	if err != nil {
		return gofakes3.PutObjectResult{}, err
	}
	if _, err := b.store.Put(context.Background(), key, &exactReader{r: input, left: size}, storedMeta(meta), cond); err != nil {
		if errors.Is(err, gofakes3.ErrIncompleteBody) {
			return gofakes3.PutObjectResult{}, gofakes3.ErrIncompleteBody
		}
		return gofakes3.PutObjectResult{}, s3err(key, err)
	}
	return gofakes3.PutObjectResult{}, nil
}

// exactReader fails the write (before anything is renamed into place) when
// the body is shorter or longer than the declared size.
type exactReader struct {
	r    io.Reader
	left int64
}

func (e *exactReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	e.left -= int64(n)
	if e.left < 0 {
		return n, gofakes3.ErrIncompleteBody
	}
	if err == io.EOF && e.left != 0 {
		return n, gofakes3.ErrIncompleteBody
	}
	return n, err
}

func (b *backend) DeleteMulti(bucket string, keys ...string) (gofakes3.MultiDeleteResult, error) {
	var res gofakes3.MultiDeleteResult
	if err := b.checkBucket(bucket); err != nil {
		return res, err
	}
	for _, k := range keys {
		if err := b.store.Delete(context.Background(), k); err != nil {
			code := gofakes3.ErrInternal
			if errors.Is(err, objstore.ErrInvalidKey) {
				code = gofakes3.ErrInvalidArgument
			}
			res.Error = append(res.Error, gofakes3.ErrorResult{Key: k, Code: code, Message: err.Error()})
			continue
		}
		res.Deleted = append(res.Deleted, gofakes3.ObjectID{Key: k})
	}
	return res, nil
}

func (b *backend) CopyObject(srcBucket, srcKey, dstBucket, dstKey string, meta map[string]string) (gofakes3.CopyObjectResult, error) {
	if err := b.checkBucket(srcBucket); err != nil {
		return gofakes3.CopyObjectResult{}, err
	}
	if err := b.checkBucket(dstBucket); err != nil {
		return gofakes3.CopyObjectResult{}, err
	}
	ctx := context.Background()
	f, src, err := b.store.Open(ctx, srcKey)
	if err != nil {
		return gofakes3.CopyObjectResult{}, s3err(srcKey, err)
	}
	defer f.Close()
	m := storedMeta(meta)
	if m == nil {
		m = src.Meta
	}
	info, err := b.store.Put(ctx, dstKey, f, m, fsbucket.Conditions{})
	if err != nil {
		return gofakes3.CopyObjectResult{}, s3err(dstKey, err)
	}
	return gofakes3.CopyObjectResult{ETag: `"` + info.ETag + `"`, LastModified: gofakes3.NewContentTime(info.ModTime)}, nil
}

// --- multipart uploads: kept on disk (multipart.go). ---

func (b *backend) CreateMultipartUpload(bucket, key string, meta map[string]string) (gofakes3.UploadID, error) {
	if err := b.checkBucket(bucket); err != nil {
		return "", err
	}
	if err := fsbucket.ValidateKey(key); err != nil {
		return "", s3err(key, err)
	}
	return b.uploads.create(key, storedMeta(meta), b.now())
}

func (b *backend) UploadPart(bucket, key string, id gofakes3.UploadID, partNumber int, contentLength int64, input io.Reader) (string, error) {
	if err := b.checkBucket(bucket); err != nil {
		return "", err
	}
	if partNumber < 1 || partNumber > gofakes3.MaxUploadPartNumber {
		return "", gofakes3.ErrInvalidPart
	}
	return b.uploads.putPart(id, key, partNumber, contentLength, input)
}

// ListMultipartUploads lists uploads by key (then initiation), after the
// key and upload ID markers, up to limit.
func (b *backend) ListMultipartUploads(bucket string, marker *gofakes3.UploadListMarker, prefix gofakes3.Prefix, limit int64) (*gofakes3.ListMultipartUploadsResult, error) {
	if err := b.checkBucket(bucket); err != nil {
		return nil, err
	}
	all, err := b.uploads.list()
	if err != nil {
		return nil, err
	}
	res := &gofakes3.ListMultipartUploadsResult{Bucket: bucket, Prefix: prefix.Prefix, Delimiter: prefix.Delimiter, MaxUploads: limit}
	if marker != nil {
		res.KeyMarker, res.UploadIDMarker = marker.Object, marker.UploadID
	}
	passed := marker == nil || marker.Object == ""
	for _, up := range all {
		if !passed {
			switch {
			case up.info.Key < marker.Object:
				continue
			case up.info.Key == marker.Object:
				if marker.UploadID == "" {
					continue // key-marker alone skips every upload of that key
				}
				if up.id == marker.UploadID {
					passed = true
				}
				continue
			}
			passed = true
		}
		if !strings.HasPrefix(up.info.Key, prefix.Prefix) {
			continue
		}
		if limit > 0 && int64(len(res.Uploads)) == limit {
			res.IsTruncated = true
			last := res.Uploads[len(res.Uploads)-1]
			res.NextKeyMarker, res.NextUploadIDMarker = last.Key, last.UploadID
			break
		}
		res.Uploads = append(res.Uploads, gofakes3.ListMultipartUploadItem{
			Key: up.info.Key, UploadID: up.id, StorageClass: gofakes3.StorageStandard, Initiated: gofakes3.NewContentTime(up.info.Initiated),
		})
	}
	return res, nil
}

func (b *backend) ListParts(bucket, key string, id gofakes3.UploadID, marker int, limit int64) (*gofakes3.ListMultipartUploadPartsResult, error) {
	if err := b.checkBucket(bucket); err != nil {
		return nil, err
	}
	if _, err := b.uploads.info(id, key); err != nil {
		return nil, err
	}
	parts, err := b.uploads.parts(id)
	if err != nil {
		return nil, err
	}
	nums := make([]int, 0, len(parts))
	for n := range parts {
		if n > marker {
			nums = append(nums, n)
		}
	}
	sort.Ints(nums)
	res := &gofakes3.ListMultipartUploadPartsResult{Bucket: bucket, Key: key, UploadID: id, PartNumberMarker: marker, MaxParts: limit, StorageClass: gofakes3.StorageStandard}
	for _, n := range nums {
		if limit > 0 && int64(len(res.Parts)) == limit {
			res.IsTruncated = true
			break
		}
		p := parts[n]
		res.Parts = append(res.Parts, gofakes3.ListMultipartUploadPartItem{PartNumber: n, ETag: `"` + p.etag + `"`, Size: p.size, LastModified: gofakes3.NewContentTime(p.modified)})
		res.NextPartNumberMarker = n
	}
	return res, nil
}

func (b *backend) AbortMultipartUpload(bucket, key string, id gofakes3.UploadID) error {
	if err := b.checkBucket(bucket); err != nil {
		return err
	}
	return b.uploads.abort(id, key)
}

// setPending records the conditional headers of a CompleteMultipartUpload
// request; the returned func forgets them.
func (b *backend) setPending(id gofakes3.UploadID, c fsbucket.Conditions) func() {
	b.mu.Lock()
	b.pending[id] = c
	b.mu.Unlock()
	return func() {
		b.mu.Lock()
		delete(b.pending, id)
		b.mu.Unlock()
	}
}

// CompleteMultipartUpload streams the listed parts into the object under
// the key lock, honouring conditions recorded by the HTTP layer. The
// returned ETag is the MD5 of the whole body (not AWS's "<md5>-<parts>"
// form) so that HEAD, LIST and If-Match all agree on one value.
func (b *backend) CompleteMultipartUpload(bucket, key string, id gofakes3.UploadID, in *gofakes3.CompleteMultipartUploadRequest) (gofakes3.VersionID, string, error) {
	if err := b.checkBucket(bucket); err != nil {
		return "", "", err
	}
	b.mu.Lock()
	cond := b.pending[id]
	b.mu.Unlock()
	etag, err := b.uploads.complete(id, key, in.Parts, func(info uploadInfo, body io.Reader) (string, error) {
		stored, err := b.store.Put(context.Background(), key, body, info.Meta, cond)
		if err != nil {
			return "", s3err(key, err)
		}
		return `"` + stored.ETag + `"`, nil
	})
	if err != nil {
		return "", "", err
	}
	return "", etag, nil
}
