package groups

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nstance-dev/nstance/internal/server/cache"
)

// CacheMirror keeps the dynamic groups document in the server's SQLite
// cache under cache.KindGroups at Key (groups/{shard}.jsonc).
type CacheMirror struct {
	Cache *cache.Cache
	Key   string
}

var _ Mirror = CacheMirror{}

// LoadDoc implements Mirror.
func (m CacheMirror) LoadDoc(ctx context.Context) ([]byte, string, error) {
	at, err := m.Cache.SyncedAt(ctx)
	if err != nil {
		return nil, "", err
	}
	if at.IsZero() {
		return nil, "", fmt.Errorf("cache never synced: %w", ErrNoMirror)
	}
	e, err := m.Cache.Get(ctx, cache.KindGroups, m.Key)
	if errors.Is(err, cache.ErrNotFound) {
		return nil, "", nil
	}
	if err != nil {
		return nil, "", err
	}
	return e.Body, e.ETag, nil
}

// PutDoc implements Mirror.
func (m CacheMirror) PutDoc(ctx context.Context, body []byte, etag string) error {
	if body == nil {
		return m.Cache.Delete(ctx, cache.KindGroups, m.Key)
	}
	return m.Cache.Put(ctx, cache.Entry{Kind: cache.KindGroups, Key: m.Key, ETag: etag, LastModified: time.Now(), Body: body})
}
