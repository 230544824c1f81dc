package dirstore

import (
	"bytes"
	"context"
	"fmt"
	"io"

	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/fsbucket"
)

// Store is an objstore.Store over a directory.
type Store struct {
	b *fsbucket.Bucket
}

var _ objstore.Store = (*Store)(nil)

// Open uses dir as the store, creating it when missing. Every Put and
// Delete is durable (fsynced, directories included) before it returns: this
// is the server's file storage backend.
func Open(dir string) (*Store, error) {
	b, err := fsbucket.OpenWith(dir, fsbucket.Options{Sync: true})
	if err != nil {
		return nil, fmt.Errorf("open directory store: %w", err)
	}
	return &Store{b: b}, nil
}

// Dir returns the absolute directory of the store.
func (s *Store) Dir() string { return s.b.Root() }

func toInfo(i fsbucket.Info) objstore.ObjectInfo {
	return objstore.ObjectInfo{Key: i.Key, ETag: i.ETag, Size: i.Size, LastModified: i.ModTime}
}

// Get implements objstore.Store.
func (s *Store) Get(ctx context.Context, key string) (*objstore.Object, error) {
	f, info, err := s.b.Open(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	defer f.Close()
	body, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	return &objstore.Object{ObjectInfo: toInfo(info), Body: body}, nil
}

// Head implements objstore.Store.
func (s *Store) Head(ctx context.Context, key string) (*objstore.ObjectInfo, error) {
	info, err := s.b.Stat(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("head %s: %w", key, err)
	}
	oi := toInfo(info)
	return &oi, nil
}

// Put implements objstore.Store.
func (s *Store) Put(ctx context.Context, key string, body []byte, opts objstore.PutOptions) (string, error) {
	info, err := s.b.Put(ctx, key, bytes.NewReader(body), nil, fsbucket.Conditions{IfNoneMatch: opts.IfNoneMatch, IfMatch: opts.IfMatch})
	if err != nil {
		return "", fmt.Errorf("put %s: %w", key, err)
	}
	return info.ETag, nil
}

// Delete implements objstore.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.b.Delete(ctx, key); err != nil {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return nil
}

// List implements objstore.Store.
func (s *Store) List(ctx context.Context, prefix string) ([]objstore.ObjectInfo, error) {
	if err := objstore.ValidatePrefix(prefix); err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	entries, err := s.b.List(ctx, prefix)
	if err != nil {
		return nil, err
	}
	out := make([]objstore.ObjectInfo, 0, len(entries))
	for _, e := range entries {
		info, err := s.b.Stat(ctx, e.Key)
		if err != nil {
			continue // deleted since the walk
		}
		out = append(out, toInfo(info))
	}
	return out, nil
}
