package app_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/server/app"
	"github.com/nstance-dev/nstance/internal/server/cache"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/internal/server/tenantops"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// gatedStore holds every listing of prefix until release is closed.
type gatedStore struct {
	objstore.Store
	prefix  string
	release chan struct{}
}

func (g *gatedStore) List(ctx context.Context, prefix string) ([]objstore.ObjectInfo, error) {
	if prefix == g.prefix {
		select {
		case <-g.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return g.Store.List(ctx, prefix)
}

// listCounter counts the provider listings (one per periodic pass).
type listCounter struct {
	*mock.Provider
	lists atomic.Int64
}

func (c *listCounter) List(ctx context.Context) ([]provider.Instance, error) {
	c.lists.Add(1)
	return c.Provider.List(ctx)
}

func newCachedFleet(t *testing.T, store objstore.Store, p provider.Provider, db *cache.Cache) *app.Assembly {
	t.Helper()
	cfg, err := config.Parse([]byte(shardtest.Config("c1", "s1", "mock")))
	require.NoError(t, err)
	f, err := app.Assemble(app.Parts{Config: cfg, ConfigETag: "e1", Store: store, Keys: layout.New(""), Provider: p, Cache: db,
		Tuning: app.Tuning{ResyncInterval: 50 * time.Millisecond, RetryBase: 20 * time.Millisecond}})
	require.NoError(t, err)
	return f
}

func runFleet(t *testing.T, f *app.Assembly) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Lead(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); require.NoError(t, <-done) }) }
	t.Cleanup(stop)
	return stop
}

// storageRecords decodes every record object in storage, by id.
func storageRecords(t *testing.T, store objstore.Store) map[string]*instances.Record {
	ctx := context.Background()
	infos, err := store.List(ctx, layout.New("").InstancePrefix("s1"))
	require.NoError(t, err)
	out := map[string]*instances.Record{}
	for _, info := range infos {
		o, err := store.Get(ctx, info.Key)
		require.NoError(t, err)
		var r instances.Record
		require.NoError(t, json.Unmarshal(o.Body, &r))
		out[r.ID] = &r
	}
	return out
}

func ids(recs []*instances.Record) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.ID)
	}
	sort.Strings(out)
	return out
}

// TestTakeoverFromStaleCache: a new term serves reads from its cache at
// once, and a cache that is stale in every direction (an instance storage
// no longer has, an instance storage has that the cache misses, a record
// changed since) causes no create and no delete: nothing acts before the
// state was checked against storage, after which it equals storage.
func TestTakeoverFromStaleCache(t *testing.T) {
	ctx := context.Background()
	keys := layout.New("")
	mem := memstore.New()
	db, err := cache.Open(ctx, filepath.Join(t.TempDir(), "db", "s1.sqlite"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	sources := []cache.Source{{Kind: cache.KindInstance, Prefix: keys.InstancePrefix("s1")}, {Kind: cache.KindGroups, Key: keys.Groups("s1")},
		{Kind: cache.KindTenantGroups, Prefix: keys.TenantGroupsPrefix("s1")}}
	_, err = db.Rebuild(ctx, mem, sources, time.Now()) // as nstance-server does at start
	require.NoError(t, err)

	// An earlier term: group web of 3, mirrored into the cache.
	p := &listCounter{Provider: mock.New()}
	first := newCachedFleet(t, mem, p, db)
	stopFirst := runFleet(t, first)
	require.Eventually(t, first.Reconciler.Verified, 5*time.Second, time.Millisecond)
	_, _, err = first.Ops.UpsertGroup(ctx, "t", &nstancev1.GroupSpec{GroupId: "web", Template: "worker", Size: 3}, "")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return len(first.Instances.List(func(r *instances.Record) bool { return r.State == instances.StateRunning })) == 3
	}, 5*time.Second, 5*time.Millisecond)
	stopFirst()
	recs := first.Instances.List(nil)
	require.Len(t, recs, 3)
	a, b, c := recs[0], recs[1], recs[2]

	// The cache goes stale: it keeps an instance x storage does not have,
	// misses c, and holds b as it was before another leader changed it.
	ghost := *a
	ghost.ID, ghost.ProviderID = "web-0000dead", "nstance://c1/s1/web-0000dead"
	body, err := json.Marshal(&ghost)
	require.NoError(t, err)
	require.NoError(t, db.Put(ctx, cache.Entry{Kind: cache.KindInstance, Key: keys.Instance("s1", ghost.ID), ETag: "ghost", Body: body}))
	require.NoError(t, db.Delete(ctx, cache.KindInstance, keys.Instance("s1", c.ID)))
	bObj, err := mem.Get(ctx, keys.Instance("s1", b.ID))
	require.NoError(t, err)
	var bNew instances.Record
	require.NoError(t, json.Unmarshal(bObj.Body, &bNew))
	bNew.Labels = map[string]string{"changed": "by-another-leader"}
	bBody, err := json.Marshal(&bNew)
	require.NoError(t, err)
	_, err = mem.Put(ctx, bObj.Key, bBody, objstore.PutOptions{IfMatch: bObj.ETag})
	require.NoError(t, err)
	creates, deletes := p.Counts()

	// The new term, with storage's listing of the records held back.
	gate := &gatedStore{Store: mem, prefix: keys.InstancePrefix("s1"), release: make(chan struct{})}
	second := newCachedFleet(t, gate, p, db)
	sub := second.Events.Instances.Subscribe("t")
	t.Cleanup(sub.Close)
	runFleet(t, second)
	require.Eventually(t, second.Reconciler.Running, 5*time.Second, time.Millisecond)
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, second.Reconciler.AwaitLoaded(lctx), "reads are served before storage answered")
	require.False(t, second.Reconciler.Verified())
	served := second.Ops.ListInstances("t", nil, nil, false)
	var servedIDs []string
	for _, st := range served {
		servedIDs = append(servedIDs, st.GetInstanceId())
	}
	sort.Strings(servedIDs)
	require.Equal(t, ids([]*instances.Record{a, b, &ghost}), servedIDs, "the cache's view, served at once")
	require.Len(t, second.Ops.ListGroups("t"), 1)
	// A mutation on the stale view waits for the check against storage.
	delDone := make(chan error, 1)
	go func() {
		_, err := second.Ops.DeleteInstance(ctx, "t", ghost.ID, true)
		delDone <- err
	}()
	require.False(t, second.Reconciler.Verified())
	c2, d2 := p.Counts()
	require.Equal(t, [2]int{creates, deletes}, [2]int{c2, d2}, "nothing acted on the cache")

	close(gate.release)
	require.Eventually(t, second.Reconciler.Verified, 10*time.Second, time.Millisecond)
	require.ErrorIs(t, <-delDone, tenantops.ErrNotFound, "the ghost is not in storage")

	// The index equals storage.
	want := storageRecords(t, mem)
	got := second.Instances.List(nil)
	require.Equal(t, []string{a.ID, b.ID, c.ID}, ids(got))
	for _, r := range got {
		require.Equal(t, want[r.ID], r, "record %s", r.ID)
	}
	require.Equal(t, "by-another-leader", got[1].Labels["changed"])
	// So does the cache.
	es, err := db.List(ctx, cache.KindInstance)
	require.NoError(t, err)
	infos, err := mem.List(ctx, keys.InstancePrefix("s1"))
	require.NoError(t, err)
	require.Len(t, es, len(infos))
	for i := range es {
		require.Equal(t, infos[i].Key, es[i].Key)
		require.Equal(t, infos[i].ETag, es[i].ETag)
	}
	// A watcher that joined on the cache's view learns the ghost is gone.
	select {
	case ev := <-sub.Events():
		require.Equal(t, ghost.ID, ev.GetInstanceId())
		require.Equal(t, nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETED, ev.GetStatus())
	case <-time.After(10 * time.Second):
		t.Fatal("no event for the instance the cache had wrong")
	}
	// Three periodic passes later, still no create and no delete: the
	// cache's missing c was not taken for an orphan, nor its ghost for a
	// member to replace or scale down.
	seen := p.lists.Load()
	require.Eventually(t, func() bool { return p.lists.Load() >= seen+3 }, 10*time.Second, time.Millisecond)
	c3, d3 := p.Counts()
	require.Equal(t, [2]int{creates, deletes}, [2]int{c3, d3})
	require.Len(t, second.Instances.List(nil), 3)
}

// countingStore counts record reads and what is listed.
type countingStore struct {
	objstore.Store
	mu     sync.Mutex
	gets   int
	got    []string // the keys read, for a failure's message
	listed []string
}

func (s *countingStore) Get(ctx context.Context, key string) (*objstore.Object, error) {
	s.mu.Lock()
	s.gets++
	s.got = append(s.got, key)
	s.mu.Unlock()
	return s.Store.Get(ctx, key)
}

func (s *countingStore) List(ctx context.Context, prefix string) ([]objstore.ObjectInfo, error) {
	s.mu.Lock()
	s.listed = append(s.listed, prefix)
	s.mu.Unlock()
	return s.Store.List(ctx, prefix)
}

func (s *countingStore) reset() (gets int, listed []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	gets, listed = s.gets, s.listed
	s.gets, s.got, s.listed = 0, nil, nil
	return gets, listed
}

// TestWarmTakeoverReadsOnlyChanges is the small version of the takeover
// benchmark (bench/takeover): a term that starts from a fresh cache reads
// from storage one listing of the records and one of the tenants' groups
// documents plus the shared groups document,
// whatever the history in the bucket (used nonce markers), and a record
// changed since costs one read.
func TestWarmTakeoverReadsOnlyChanges(t *testing.T) {
	ctx := context.Background()
	keys := layout.New("")
	mem := memstore.New()
	store := &countingStore{Store: mem}
	db, err := cache.Open(ctx, filepath.Join(t.TempDir(), "db", "s1.sqlite"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	_, err = db.Rebuild(ctx, store, []cache.Source{{Kind: cache.KindInstance, Prefix: keys.InstancePrefix("s1")}, {Kind: cache.KindGroups, Key: keys.Groups("s1")},
		{Kind: cache.KindTenantGroups, Prefix: keys.TenantGroupsPrefix("s1")}}, time.Now())
	require.NoError(t, err)
	p := mock.New()
	first := newCachedFleet(t, store, p, db)
	stop := runFleet(t, first)
	require.Eventually(t, first.Reconciler.Verified, 5*time.Second, time.Millisecond)
	for _, g := range []string{"a", "b", "c"} {
		_, _, err = first.Ops.UpsertGroup(ctx, "t", &nstancev1.GroupSpec{GroupId: g, Template: "worker", Size: 10}, "")
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		return len(first.Instances.List(func(r *instances.Record) bool { return r.State == instances.StateRunning })) == 30
	}, 10*time.Second, 5*time.Millisecond)
	stop()
	// History: 500 used nonce markers of the shard and 50 of the cluster.
	for i := range 550 {
		k := keys.ShardNonce("s1", "jti-"+strconv.Itoa(i))
		if i >= 500 {
			k = keys.ClusterNonce("jti-" + strconv.Itoa(i))
		}
		_, err := mem.Put(ctx, k, []byte(`{}`), objstore.PutOptions{IfNoneMatch: true})
		require.NoError(t, err)
	}

	for round, change := range []bool{false, true} {
		if change {
			// Another writer changes one record: the next term reads it once.
			rec := first.Instances.List(nil)[7]
			o, err := mem.Get(ctx, keys.Instance("s1", rec.ID))
			require.NoError(t, err)
			rec.Labels = map[string]string{"round": "2"}
			body, err := json.Marshal(rec)
			require.NoError(t, err)
			_, err = mem.Put(ctx, o.Key, body, objstore.PutOptions{IfMatch: o.ETag})
			require.NoError(t, err)
		}
		store.reset()
		next := newCachedFleet(t, store, p, db)
		stopNext := runFleet(t, next)
		require.Eventually(t, next.Reconciler.Verified, 5*time.Second, time.Millisecond)
		store.mu.Lock()
		got := append([]string(nil), store.got...)
		store.mu.Unlock()
		gets, listed := store.reset()
		stopNext()
		require.ElementsMatch(t, []string{keys.InstancePrefix("s1"), keys.TenantGroupsPrefix("s1")}, listed,
			"round %d: two listings, of the records and of the tenants' groups documents", round)
		want := 1 // the shared groups document; the tenant's own is unchanged, known by its listed etag
		if change {
			want++
		}
		require.Equal(t, want, gets, "round %d: storage reads at takeover: %q", round, got)
		require.Len(t, next.Instances.List(nil), 30)
	}
}
