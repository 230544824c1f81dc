package groups

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nstance-dev/nstance/internal/server/cache"
)

// CacheMirror keeps the dynamic groups documents in the server's SQLite
// cache: the shared document under cache.KindGroups at Key
// (groups/{shard}.jsonc), the tenants' under cache.KindTenantGroups.
type CacheMirror struct {
	Cache *cache.Cache
	Key   string
}

var _ Mirror = CacheMirror{}

// LoadDocs implements Mirror.
func (m CacheMirror) LoadDocs(ctx context.Context) ([]MirroredDoc, error) {
	at, err := m.Cache.SyncedAt(ctx)
	if err != nil {
		return nil, err
	}
	if at.IsZero() {
		return nil, fmt.Errorf("cache never synced: %w", ErrNoMirror)
	}
	var docs []MirroredDoc
	e, err := m.Cache.Get(ctx, cache.KindGroups, m.Key)
	switch {
	case err == nil:
		docs = append(docs, MirroredDoc{Key: e.Key, Body: e.Body, ETag: e.ETag})
	case !errors.Is(err, cache.ErrNotFound):
		return nil, err
	}
	es, err := m.Cache.List(ctx, cache.KindTenantGroups)
	if err != nil {
		return nil, err
	}
	for _, e := range es {
		docs = append(docs, MirroredDoc{Key: e.Key, Body: e.Body, ETag: e.ETag})
	}
	return docs, nil
}

// PutDoc implements Mirror.
func (m CacheMirror) PutDoc(ctx context.Context, key string, body []byte, etag string) error {
	kind := cache.KindTenantGroups
	if key == m.Key {
		kind = cache.KindGroups
	}
	if body == nil {
		return m.Cache.Delete(ctx, kind, key)
	}
	return m.Cache.Put(ctx, cache.Entry{Kind: kind, Key: key, ETag: etag, LastModified: time.Now(), Body: body})
}
