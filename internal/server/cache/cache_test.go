package cache

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

func TestRebuildMirrorsStorage(t *testing.T) {
	ctx := context.Background()
	for _, path := range []string{"", filepath.Join(t.TempDir(), "db", "s1.sqlite")} {
		c, err := Open(ctx, path)
		require.NoError(t, err)
		t.Cleanup(func() { _ = c.Close() })
		store := memstore.New()
		put := func(k, v string) {
			_, err := store.Put(ctx, k, []byte(v), objstore.PutOptions{})
			require.NoError(t, err)
		}
		put("shard/s1/instances/i-1.json", `{"id":"i-1"}`)
		put("shard/s1/instances/i-2.json", `{"id":"i-2"}`)
		put("shard/s1/nonces/j1", `{}`)
		put("groups/s1.jsonc", `{}`)
		sources := []Source{
			{Kind: "instance", Prefix: "shard/s1/instances/"},
			{Kind: "nonce", Prefix: "shard/s1/nonces/", SkipBodies: true},
			{Kind: "groups", Key: "groups/s1.jsonc"},
		}
		// Stale entry that storage no longer has must disappear.
		require.NoError(t, c.Put(ctx, Entry{Kind: "instance", Key: "shard/s1/instances/gone.json", ETag: "x"}))
		require.NoError(t, c.Rebuild(ctx, store, sources, time.Now()))

		list, err := c.List(ctx, "instance")
		require.NoError(t, err)
		require.Len(t, list, 2)
		require.Equal(t, "i-1", KeyBase(list[0].Key))
		require.JSONEq(t, `{"id":"i-1"}`, string(list[0].Body))
		n, err := c.Count(ctx, "nonce")
		require.NoError(t, err)
		require.Equal(t, 1, n)
		g, err := c.Get(ctx, "groups", "groups/s1.jsonc")
		require.NoError(t, err)
		require.NotEmpty(t, g.ETag)
		_, err = c.Get(ctx, "instance", "shard/s1/instances/gone.json")
		require.ErrorIs(t, err, ErrNotFound)
		at, err := c.SyncedAt(ctx)
		require.NoError(t, err)
		require.False(t, at.IsZero())

		require.NoError(t, c.Wipe(ctx))
		n, err = c.Count(ctx, "instance")
		require.NoError(t, err)
		require.Zero(t, n)
	}
}

func TestOpenBadPath(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	c, err := Open(context.Background(), file)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	_, err = Open(context.Background(), filepath.Join(file, "sub", "x.sqlite"))
	require.Error(t, err)
}
