package instances

import (
	"context"
	"fmt"
	"time"

	"github.com/nstance-dev/nstance/internal/server/cache"
)

// CacheMirror mirrors the records into the server's SQLite cache under
// cache.KindInstance.
type CacheMirror struct {
	Cache *cache.Cache
}

var _ Mirror = CacheMirror{}

// Load implements Mirror: ErrNoMirror until the cache was filled from
// storage at least once (cache.Rebuild).
func (m CacheMirror) Load(ctx context.Context) ([]MirrorObject, error) {
	at, err := m.Cache.SyncedAt(ctx)
	if err != nil {
		return nil, err
	}
	if at.IsZero() {
		return nil, fmt.Errorf("cache never synced: %w", ErrNoMirror)
	}
	es, err := m.Cache.List(ctx, cache.KindInstance)
	if err != nil {
		return nil, err
	}
	out := make([]MirrorObject, len(es))
	for i, e := range es {
		out[i] = MirrorObject{Key: e.Key, ETag: e.ETag, Body: e.Body}
	}
	return out, nil
}

// Apply implements Mirror.
func (m CacheMirror) Apply(ctx context.Context, puts []MirrorObject, deletes []string) error {
	now := time.Now()
	es := make([]cache.Entry, len(puts))
	for i, o := range puts {
		es[i] = cache.Entry{Kind: cache.KindInstance, Key: o.Key, ETag: o.ETag, LastModified: now, Body: o.Body}
	}
	return m.Cache.Apply(ctx, cache.KindInstance, es, deletes)
}

// Put implements Mirror.
func (m CacheMirror) Put(ctx context.Context, o MirrorObject) error {
	return m.Cache.Put(ctx, cache.Entry{Kind: cache.KindInstance, Key: o.Key, ETag: o.ETag, LastModified: time.Now(), Body: o.Body})
}

// Delete implements Mirror.
func (m CacheMirror) Delete(ctx context.Context, key string) error {
	return m.Cache.Delete(ctx, cache.KindInstance, key)
}
