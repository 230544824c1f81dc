package gcsstore

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"

	"github.com/nstance-dev/nstance/pkg/objstore"
)

// Store is an objstore.Store over one GCS bucket, optionally under a key
// prefix.
type Store struct {
	client *storage.Client
	bucket *storage.BucketHandle
	name   string
	prefix string
}

var _ objstore.Store = (*Store)(nil)

// New builds a client (Application Default Credentials, or the emulator
// STORAGE_EMULATOR_HOST names; opts are passed on, e.g. option.WithEndpoint)
// and returns a store over bucket. prefix, when not empty, is prepended to
// every key (a trailing slash is added when missing). Close releases the
// client.
func New(ctx context.Context, bucket, prefix string, opts ...option.ClientOption) (*Store, error) {
	if bucket == "" {
		return nil, errors.New("gcsstore: bucket name is empty")
	}
	client, err := storage.NewClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("gcsstore: create the storage client: %w", err)
	}
	s, err := NewWithClient(client, bucket, prefix)
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	return s, nil
}

// NewWithClient returns a store that uses an existing client.
func NewWithClient(client *storage.Client, bucket, prefix string) (*Store, error) {
	if bucket == "" {
		return nil, errors.New("gcsstore: bucket name is empty")
	}
	if prefix != "" {
		if err := objstore.ValidatePrefix(prefix); err != nil {
			return nil, fmt.Errorf("gcsstore: key prefix: %w", err)
		}
		if !strings.HasSuffix(prefix, "/") {
			prefix += "/"
		}
	}
	return &Store{client: client, bucket: client.Bucket(bucket), name: bucket, prefix: prefix}, nil
}

// Close releases the client.
func (s *Store) Close() error { return s.client.Close() }

func (s *Store) full(key string) string { return s.prefix + key }

// validate applies objstore.ValidateKey and GCS's own rules: the prefixed
// name fits in 1024 bytes and holds no carriage return or line feed.
func (s *Store) validate(key string) error {
	if err := objstore.ValidateKey(key); err != nil {
		return err
	}
	if strings.ContainsAny(key, "\r\n") {
		return fmt.Errorf("%w: %q contains a carriage return or line feed, which GCS refuses", objstore.ErrInvalidKey, key)
	}
	if n := len(s.prefix) + len(key); n > objstore.MaxKeyLength {
		return fmt.Errorf("%w: %q with the store prefix %q is %d bytes, longer than %d", objstore.ErrInvalidKey, key, s.prefix, n, objstore.MaxKeyLength)
	}
	return nil
}

func md5hex(b []byte) string {
	sum := md5.Sum(b)
	return hex.EncodeToString(sum[:])
}

// mapErr turns GCS errors into objstore errors, keeping the original text.
// A missing bucket is not ErrNotFound: it is a configuration error.
func mapErr(op, key string, err error) error {
	if errors.Is(err, storage.ErrObjectNotExist) {
		return fmt.Errorf("%s %s: %w: %v", op, key, objstore.ErrNotFound, err)
	}
	var ge *googleapi.Error
	if errors.As(err, &ge) && ge.Code == http.StatusPreconditionFailed {
		return fmt.Errorf("%s %s: %w: %v", op, key, objstore.ErrPreconditionFailed, err)
	}
	return fmt.Errorf("%s %s: %w", op, key, err)
}

func (s *Store) info(key string, a *storage.ObjectAttrs) objstore.ObjectInfo {
	return objstore.ObjectInfo{Key: key, ETag: hex.EncodeToString(a.MD5), Size: a.Size, LastModified: a.Updated}
}

// Get implements objstore.Store. The ETag is the MD5 of the body read.
func (s *Store) Get(ctx context.Context, key string) (*objstore.Object, error) {
	if err := s.validate(key); err != nil {
		return nil, fmt.Errorf("get: %w", err)
	}
	r, err := s.bucket.Object(s.full(key)).NewReader(ctx)
	if err != nil {
		return nil, mapErr("get", key, err)
	}
	defer r.Close()
	body, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("get %s: read body: %w", key, err)
	}
	return &objstore.Object{
		ObjectInfo: objstore.ObjectInfo{Key: key, ETag: md5hex(body), Size: int64(len(body)), LastModified: r.Attrs.LastModified},
		Body:       body,
	}, nil
}

// Head implements objstore.Store.
func (s *Store) Head(ctx context.Context, key string) (*objstore.ObjectInfo, error) {
	if err := s.validate(key); err != nil {
		return nil, fmt.Errorf("head: %w", err)
	}
	a, err := s.bucket.Object(s.full(key)).Attrs(ctx)
	if err != nil {
		return nil, mapErr("head", key, err)
	}
	info := s.info(key, a)
	return &info, nil
}

// Put implements objstore.Store: one request per write (no resumable
// upload), with the body's MD5 for the server to check. IfNoneMatch is the
// DoesNotExist precondition; IfMatch reads the generation whose MD5 equals
// the ETag given and writes on the condition that it is still current.
func (s *Store) Put(ctx context.Context, key string, body []byte, opts objstore.PutOptions) (string, error) {
	if err := s.validate(key); err != nil {
		return "", fmt.Errorf("put: %w", err)
	}
	obj := s.bucket.Object(s.full(key))
	switch {
	case opts.IfNoneMatch:
		obj = obj.If(storage.Conditions{DoesNotExist: true})
	case opts.IfMatch != "":
		gen, err := s.generationOf(ctx, key, strings.Trim(opts.IfMatch, `"`))
		if err != nil {
			return "", err
		}
		obj = obj.If(storage.Conditions{GenerationMatch: gen})
	}
	sum := md5.Sum(body)
	w := obj.NewWriter(ctx)
	w.ChunkSize = 0
	w.MD5 = sum[:]
	if _, err := w.Write(body); err != nil {
		_ = w.Close()
		return "", mapErr("put", key, err)
	}
	if err := w.Close(); err != nil {
		return "", mapErr("put", key, err)
	}
	return hex.EncodeToString(sum[:]), nil
}

// generationOf returns the current generation of key if its MD5 is etag;
// otherwise (or when the key is missing) ErrPreconditionFailed.
func (s *Store) generationOf(ctx context.Context, key, etag string) (int64, error) {
	a, err := s.bucket.Object(s.full(key)).Attrs(ctx)
	if err != nil {
		err = mapErr("put", key, err)
		if errors.Is(err, objstore.ErrNotFound) {
			return 0, fmt.Errorf("put %s: %w: object does not exist", key, objstore.ErrPreconditionFailed)
		}
		return 0, err
	}
	if cur := hex.EncodeToString(a.MD5); cur != etag {
		return 0, fmt.Errorf("put %s: %w: ETag is %q, not %q", key, objstore.ErrPreconditionFailed, cur, etag)
	}
	return a.Generation, nil
}

// Delete implements objstore.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.validate(key); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	if err := s.bucket.Object(s.full(key)).Delete(ctx); err != nil {
		err = mapErr("delete", key, err)
		if errors.Is(err, objstore.ErrNotFound) {
			return nil
		}
		return err
	}
	return nil
}

// List implements objstore.Store, following every page.
func (s *Store) List(ctx context.Context, prefix string) ([]objstore.ObjectInfo, error) {
	if err := objstore.ValidatePrefix(prefix); err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	q := &storage.Query{Prefix: s.full(prefix)}
	if err := q.SetAttrSelection([]string{"Name", "MD5", "Size", "Updated"}); err != nil {
		return nil, fmt.Errorf("list %s: %w", prefix, err)
	}
	it := s.bucket.Objects(ctx, q)
	out := []objstore.ObjectInfo{}
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("list %s in bucket %s: %w", prefix, s.name, err)
		}
		out = append(out, s.info(strings.TrimPrefix(a.Name, s.prefix), a))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}
