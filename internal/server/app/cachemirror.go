package app

import (
	"context"
	"time"

	"github.com/nstance-dev/nstance/internal/server/cache"
	"github.com/nstance-dev/nstance/internal/server/instances"
)

// CacheMirror keeps the app cache's "instance" kind in step with the store.
type CacheMirror struct {
	Cache  *cache.Cache
	Prefix string
}

var _ instances.Mirror = CacheMirror{}

// Reset implements instances.Mirror.
func (m CacheMirror) Reset(ctx context.Context, objs []instances.MirrorObject) error {
	have, err := m.Cache.List(ctx, KindInstance)
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, o := range objs {
		keep[o.Key] = true
		if err := m.Put(ctx, o); err != nil {
			return err
		}
	}
	for _, e := range have {
		if !keep[e.Key] {
			if err := m.Cache.Delete(ctx, KindInstance, e.Key); err != nil {
				return err
			}
		}
	}
	return nil
}

// Put implements instances.Mirror.
func (m CacheMirror) Put(ctx context.Context, o instances.MirrorObject) error {
	return m.Cache.Put(ctx, cache.Entry{Kind: KindInstance, Key: o.Key, ETag: o.ETag, LastModified: time.Now(), Body: o.Body})
}

// Delete implements instances.Mirror.
func (m CacheMirror) Delete(ctx context.Context, key string) error {
	return m.Cache.Delete(ctx, KindInstance, key)
}
