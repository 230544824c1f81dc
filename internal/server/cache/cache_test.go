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
		st, err := c.Rebuild(ctx, store, sources, time.Now())
		require.NoError(t, err)
		require.Equal(t, RebuildStats{Listed: 4, Fetched: 3, Removed: 1}, st)

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

		// Incremental: unchanged objects are not read again; a changed and a
		// new one are; a deleted one is removed.
		put("shard/s1/instances/i-2.json", `{"id":"i-2","v":2}`)
		put("shard/s1/instances/i-3.json", `{"id":"i-3"}`)
		require.NoError(t, store.Delete(ctx, "shard/s1/instances/i-1.json"))
		st, err = c.Rebuild(ctx, store, sources, time.Now())
		require.NoError(t, err)
		require.Equal(t, RebuildStats{Listed: 4, Fetched: 3, Removed: 1}, st, "i-2, i-3 and the groups document read; i-1 removed")
		list, err = c.List(ctx, "instance")
		require.NoError(t, err)
		require.Len(t, list, 2)
		require.JSONEq(t, `{"id":"i-2","v":2}`, string(list[0].Body))
		require.Equal(t, "i-3", KeyBase(list[1].Key))
		st, err = c.Rebuild(ctx, store, sources, time.Now())
		require.NoError(t, err)
		require.Equal(t, RebuildStats{Listed: 4, Fetched: 1, Removed: 0}, st, "only the single-key groups document is read again")

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

func TestApplyBatch(t *testing.T) {
	ctx := context.Background()
	c, err := Open(ctx, filepath.Join(t.TempDir(), "c.sqlite"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.Apply(ctx, KindInstance, []Entry{{Key: "a", ETag: "1", Body: []byte("A")}, {Key: "b", ETag: "1"}}, nil))
	require.NoError(t, c.Apply(ctx, KindInstance, []Entry{{Key: "c", ETag: "2"}}, []string{"a"}))
	tags, err := c.ETags(ctx, KindInstance)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"b": "1", "c": "2"}, tags)
	n, err := c.Count(ctx, KindGroups)
	require.NoError(t, err)
	require.Zero(t, n, "kinds are separate")
}
