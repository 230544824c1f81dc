package memstore

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nstance-dev/nstance/pkg/objstore"
)

// Store keeps objects in a map guarded by a mutex.
type Store struct {
	mu      sync.Mutex
	objects map[string]objstore.Object
	now     func() time.Time
}

var _ objstore.Store = (*Store)(nil)

// New returns an empty store.
func New() *Store {
	return &Store{objects: map[string]objstore.Object{}, now: time.Now}
}

func clone(b []byte) []byte { return append([]byte{}, b...) }

// Get implements objstore.Store.
func (s *Store) Get(ctx context.Context, key string) (*objstore.Object, error) {
	if err := objstore.ValidateKey(key); err != nil {
		return nil, fmt.Errorf("get: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objects[key]
	if !ok {
		return nil, fmt.Errorf("get %s: %w", key, objstore.ErrNotFound)
	}
	o.Body = clone(o.Body)
	return &o, nil
}

// Head implements objstore.Store.
func (s *Store) Head(ctx context.Context, key string) (*objstore.ObjectInfo, error) {
	if err := objstore.ValidateKey(key); err != nil {
		return nil, fmt.Errorf("head: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	o, ok := s.objects[key]
	if !ok {
		return nil, fmt.Errorf("head %s: %w", key, objstore.ErrNotFound)
	}
	info := o.ObjectInfo
	return &info, nil
}

// Put implements objstore.Store.
func (s *Store) Put(ctx context.Context, key string, body []byte, opts objstore.PutOptions) (string, error) {
	if err := objstore.ValidateKey(key); err != nil {
		return "", fmt.Errorf("put: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("put %s: %w", key, err)
	}
	sum := md5.Sum(body)
	etag := hex.EncodeToString(sum[:])
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, exists := s.objects[key]
	if opts.IfNoneMatch && exists {
		return "", fmt.Errorf("put %s: %w: already exists", key, objstore.ErrPreconditionFailed)
	}
	if opts.IfMatch != "" && (!exists || cur.ETag != strings.Trim(opts.IfMatch, `"`)) {
		return "", fmt.Errorf("put %s: %w: ETag differs or object missing", key, objstore.ErrPreconditionFailed)
	}
	s.objects[key] = objstore.Object{
		ObjectInfo: objstore.ObjectInfo{Key: key, ETag: etag, Size: int64(len(body)), LastModified: s.now().UTC()},
		Body:       clone(body),
	}
	return etag, nil
}

// Delete implements objstore.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := objstore.ValidateKey(key); err != nil {
		return fmt.Errorf("delete: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.objects, key)
	return nil
}

// List implements objstore.Store.
func (s *Store) List(ctx context.Context, prefix string) ([]objstore.ObjectInfo, error) {
	if err := objstore.ValidatePrefix(prefix); err != nil {
		return nil, fmt.Errorf("list: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []objstore.ObjectInfo{}
	for k, o := range s.objects {
		if strings.HasPrefix(k, prefix) {
			out = append(out, o.ObjectInfo)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}
