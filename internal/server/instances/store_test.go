package instances_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/server/cache"
	"github.com/nstance-dev/nstance/internal/server/instances"
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

// TestCreateSurvivesARetriedCreate: the SDK retrying a committed create
// (reply lost) gets 412 for its own object; Create checks the stored content
// and succeeds, while another writer's record stays a conflict. Refresh reads
// a record the index does not know yet.
func TestCreateSurvivesARetriedCreate(t *testing.T) {
	ctx := context.Background()
	obj := memstore.New()
	keys := layout.New("")
	s := instances.NewStore(obj, keys, "s1", nil)
	rec := &instances.Record{ID: "web-00000002", Tenant: "acme", Shard: "s1", State: instances.StatePending, CreatedAt: time.Now().UTC()}
	body, err := json.Marshal(rec)
	require.NoError(t, err)
	// The first attempt committed; its reply never arrived.
	_, err = obj.Put(ctx, keys.Instance("s1", rec.ID), body, objstore.PutOptions{IfNoneMatch: true})
	require.NoError(t, err)
	require.NoError(t, s.Create(ctx, rec))
	got, ok := s.Get(rec.ID)
	require.True(t, ok)
	require.Equal(t, "acme", got.Tenant)
	other := rec.Clone()
	other.Tenant = "evil"
	require.ErrorIs(t, s.Create(ctx, other), instances.ErrExists)

	// Refresh: a record written by another server, unknown to this index.
	fresh := instances.NewStore(obj, keys, "s1", nil)
	_, ok = fresh.Get(rec.ID)
	require.False(t, ok)
	r, err := fresh.Refresh(ctx, rec.ID)
	require.NoError(t, err)
	require.Equal(t, rec.ID, r.ID)
	_, ok = fresh.Get(rec.ID)
	require.True(t, ok, "Refresh updates the index")
	_, err = fresh.Refresh(ctx, "web-missing")
	require.ErrorIs(t, err, instances.ErrNotFound)
	_, err = fresh.Refresh(ctx, "../x")
	require.ErrorIs(t, err, instances.ErrNotFound)
}

// TestProtoCarriesProviderAddresses: the status lists the instance's host
// name and the provider-reported addresses (what its agent certificate
// names).
func TestProtoCarriesProviderAddresses(t *testing.T) {
	r := &instances.Record{ID: "web-1", Addresses: []string{"10.0.0.7", "web-1.internal"}}
	var got []string
	for _, a := range r.Proto().GetAddresses() {
		got = append(got, a.GetType().String()+"="+a.GetAddress())
	}
	require.Equal(t, []string{"ADDRESS_TYPE_HOSTNAME=web-1", "ADDRESS_TYPE_INTERNAL_IP=10.0.0.7", "ADDRESS_TYPE_INTERNAL_DNS=web-1.internal"}, got)
}

// TestSyncCorrectsAStaleCache: an index filled from a stale cache (a record
// storage no longer has, one it misses, one changed since, a torn entry) is
// equal to storage after Sync, which reads only what differs; the token and
// group indexes follow, and the cache is corrected too.
func TestSyncCorrectsAStaleCache(t *testing.T) {
	ctx := context.Background()
	obj := memstore.New()
	keys := layout.New("")
	db, err := cache.Open(ctx, "")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	mirror := instances.CacheMirror{Cache: db}
	writer := instances.NewStore(obj, keys, "s1", mirror)
	mk := func(id, token string) *instances.Record {
		return &instances.Record{ID: id, Tenant: "acme", GroupID: "web", Shard: "s1", State: instances.StateRunning, ClientToken: token}
	}
	for _, r := range []*instances.Record{mk("web-a", "ta"), mk("web-b", "tb"), mk("web-c", "tc")} {
		require.NoError(t, writer.Create(ctx, r))
	}
	_, err = db.Rebuild(ctx, obj, nil, time.Now()) // marks the cache synced
	require.NoError(t, err)

	// Storage moves on without the cache: a deleted, b changed (its token
	// too), d created; the cache also gets a torn entry.
	require.NoError(t, obj.Delete(ctx, keys.Instance("s1", "web-a")))
	b := mk("web-b", "tb2")
	b.Message = "changed"
	body, err := json.Marshal(b)
	require.NoError(t, err)
	_, err = obj.Put(ctx, keys.Instance("s1", "web-b"), body, objstore.PutOptions{})
	require.NoError(t, err)
	body, err = json.Marshal(mk("web-d", "td"))
	require.NoError(t, err)
	_, err = obj.Put(ctx, keys.Instance("s1", "web-d"), body, objstore.PutOptions{})
	require.NoError(t, err)
	require.NoError(t, db.Put(ctx, cache.Entry{Kind: cache.KindInstance, Key: keys.Instance("s1", "web-x"), ETag: "x", Body: []byte("{")}))

	s := instances.NewStore(obj, keys, "s1", mirror)
	n, ok, err := s.LoadCached(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 3, n, "a, b and c from the cache; the torn entry dropped")
	_, ok = s.ByClientToken("acme", "ta")
	require.True(t, ok, "the stale view")

	res, err := s.Sync(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, res.Listed)
	require.Equal(t, 2, res.Fetched, "b and d read; c unchanged")
	require.Equal(t, []string{"web-b", "web-d"}, res.Changed)
	require.Len(t, res.Removed, 1)
	require.Equal(t, "web-a", res.Removed[0].ID)
	var got []string
	for _, r := range s.List(nil) {
		got = append(got, r.ID)
	}
	require.Equal(t, []string{"web-b", "web-c", "web-d"}, got)
	rb, _ := s.Get("web-b")
	require.Equal(t, "changed", rb.Message)
	for tok, want := range map[string]bool{"ta": false, "tb": false, "tb2": true, "tc": true, "td": true} {
		_, ok := s.ByClientToken("acme", tok)
		require.Equal(t, want, ok, "token %s", tok)
	}
	require.Len(t, s.ListGroup("acme", "web"), 3)
	tags, err := db.ETags(ctx, cache.KindInstance)
	require.NoError(t, err)
	infos, err := obj.List(ctx, keys.InstancePrefix("s1"))
	require.NoError(t, err)
	want := map[string]string{}
	for _, i := range infos {
		want[i.Key] = i.ETag
	}
	require.Equal(t, want, tags, "the cache equals storage")

	// A write after the check goes through with the current etag.
	_, err = s.Update(ctx, "web-b", func(r *instances.Record) error { r.Message = "again"; return nil })
	require.NoError(t, err)
	res, err = s.Sync(ctx)
	require.NoError(t, err)
	require.Zero(t, res.Fetched, "the index's etags are storage's")
}

func TestEachVisitsEveryRecordOnce(t *testing.T) {
	ctx := context.Background()
	s := instances.NewStore(memstore.New(), layout.New(""), "s1", nil)
	for i, state := range []instances.State{instances.StatePending, instances.StateRunning, instances.StateRunning} {
		require.NoError(t, s.Create(ctx, &instances.Record{ID: fmt.Sprintf("web-%08d", i), Tenant: "acme", GroupID: "web", Shard: "s1", State: state}))
	}
	seen := map[string]int{}
	byState := map[instances.State]int{}
	s.Each(func(r *instances.Record) { seen[r.ID]++; byState[r.State]++ })
	require.Equal(t, map[string]int{"web-00000000": 1, "web-00000001": 1, "web-00000002": 1}, seen)
	require.Equal(t, map[instances.State]int{instances.StatePending: 1, instances.StateRunning: 2}, byState)
	require.NoError(t, s.Delete(ctx, "web-00000001"))
	n := 0
	s.Each(func(*instances.Record) { n++ })
	require.Equal(t, 2, n)
}
