package instances_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/layout"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

func TestNewID(t *testing.T) {
	for _, prefix := range []string{"web", "Web_Servers", "a.b.c", "", "---", "x-very-long-group-name-that-goes-on-and-on-and-on-beyond-the-dns-limit"} {
		id, err := instances.NewID(prefix)
		require.NoError(t, err)
		require.Regexp(t, `^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`, id, prefix)
		other, _ := instances.NewID(prefix)
		require.NotEqual(t, id, other)
	}
}

func TestStoreRoundTripAndConflicts(t *testing.T) {
	ctx := context.Background()
	obj := memstore.New()
	keys := layout.New("")
	s := instances.NewStore(obj, keys, "s1", nil)
	now := time.Now().UTC().Truncate(time.Second)
	rec := &instances.Record{ID: "web-00000001", Tenant: "acme", GroupID: "web", Shard: "s1", State: instances.StatePending,
		ClientToken: "tok", Vars: map[string]string{"a": "b"}, CreatedAt: now}
	require.NoError(t, s.Create(ctx, rec))
	require.ErrorIs(t, s.Create(ctx, rec), instances.ErrExists)
	require.Error(t, s.Create(ctx, &instances.Record{ID: "../x"}))

	got, ok := s.Get("web-00000001")
	require.True(t, ok)
	got.Vars["a"] = "mutated"
	again, _ := s.Get("web-00000001")
	require.Equal(t, "b", again.Vars["a"], "Get returns copies")

	_, err := s.Update(ctx, "web-00000001", func(r *instances.Record) error { r.State = instances.StateRunning; return nil })
	require.NoError(t, err)

	// Another writer changes the object: Update re-reads and applies on top.
	other := instances.NewStore(obj, keys, "s1", nil)
	require.NoError(t, other.Load(ctx))
	_, err = other.Update(ctx, "web-00000001", func(r *instances.Record) error { r.Message = "from other"; return nil })
	require.NoError(t, err)
	upd, err := s.Update(ctx, "web-00000001", func(r *instances.Record) error { r.Labels = map[string]string{"x": "y"}; return nil })
	require.NoError(t, err)
	require.Equal(t, "from other", upd.Message)
	require.Equal(t, instances.StateRunning, upd.State)

	// A torn object in storage is skipped on load, never fatal.
	_, err = obj.Put(ctx, keys.Instance("s1", "torn-1"), []byte("{"), objstore.PutOptions{})
	require.NoError(t, err)
	fresh := instances.NewStore(obj, keys, "s1", nil)
	require.NoError(t, fresh.Load(ctx))
	require.Equal(t, 1, fresh.Len())
	byTok, ok := fresh.ByClientToken("acme", "tok")
	require.True(t, ok)
	require.Equal(t, "web-00000001", byTok.ID)
	_, ok = fresh.ByClientToken("globex", "tok")
	require.False(t, ok, "tokens are per tenant")
	require.Len(t, fresh.ListGroup("acme", "web"), 1)

	require.NoError(t, fresh.Delete(ctx, "web-00000001"))
	require.Empty(t, fresh.ListGroup("acme", "web"))
	_, err = obj.Head(ctx, keys.Instance("s1", "web-00000001"))
	require.ErrorIs(t, err, objstore.ErrNotFound)
	_, err = fresh.Update(ctx, "web-00000001", func(*instances.Record) error { return nil })
	require.ErrorIs(t, err, instances.ErrNotFound)
}
