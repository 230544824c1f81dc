package groups_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

// gatedStore counts Puts and, while gate is set, holds each Put until the
// test lets it through, so callers pile up behind a write in flight.
type gatedStore struct {
	objstore.Store
	puts    atomic.Int32
	entered chan string
	gate    chan struct{}
}

func (s *gatedStore) Put(ctx context.Context, key string, body []byte, opts objstore.PutOptions) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	s.puts.Add(1)
	if s.gate != nil {
		s.entered <- key
		select {
		case <-s.gate:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
	return s.Store.Put(ctx, key, body, opts)
}

// storedIDs reads the tenant's document from storage.
func storedIDs(t *testing.T, st objstore.Store, tenant string) map[string]bool {
	t.Helper()
	o, err := st.Get(context.Background(), layout.New("").TenantGroups("s1", tenant))
	require.NoError(t, err)
	var doc struct {
		Groups map[string]json.RawMessage `json:"groups"`
	}
	require.NoError(t, json.Unmarshal(o.Body, &doc))
	ids := map[string]bool{}
	for id := range doc.Groups {
		ids[id] = true
	}
	return ids
}

// TestConcurrentUpsertsShareWrites: upserts that arrive while a write of
// their tenant's document is in flight are stored together by the next
// write, each call returns only after its own group is in storage, and a
// refused change (wrong etag) fails alone without holding back the others.
func TestConcurrentUpsertsShareWrites(t *testing.T) {
	ctx := context.Background()
	st := &gatedStore{Store: memstore.New(), entered: make(chan string, 100)}
	r := groups.NewRegistry(st, layout.New(""), "s1")
	_, err := r.Load(ctx)
	require.NoError(t, err)
	first, _, err := r.Upsert(ctx, groups.Key{Tenant: "acme", ID: "g-first"}, groups.Spec{Template: "worker", Size: 1}, "")
	require.NoError(t, err)
	require.EqualValues(t, 1, st.puts.Load())

	// One write is held in flight; 20 more upserts (and one with a wrong
	// etag) queue behind it.
	st.gate = make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 30)
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _, err := r.Upsert(ctx, groups.Key{Tenant: "acme", ID: "g-held"}, groups.Spec{Template: "worker", Size: 1}, "")
		errs <- err
	}()
	<-st.entered
	const n = 20
	var stale atomic.Value
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("g-%02d", i)
			if _, _, err := r.Upsert(ctx, groups.Key{Tenant: "acme", ID: id}, groups.Spec{Template: "worker", Size: 2}, ""); err != nil {
				errs <- fmt.Errorf("%s: %w", id, err)
				return
			}
			// Returned: the group is in storage.
			if !storedIDs(t, st.Store, "acme")[id] {
				errs <- fmt.Errorf("%s returned before it was stored", id)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _, err := r.Upsert(ctx, groups.Key{Tenant: "acme", ID: "g-first"}, groups.Spec{Template: "worker", Size: 9}, "not-"+first.ETag)
		stale.Store(err)
	}()
	// Every caller waits behind the held write.
	waitQueued(t, r, "acme", n+1)
	close(st.gate) // this and every later Put pass
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.ErrorIs(t, stale.Load().(error), groups.ErrETag)
	ids := storedIDs(t, st.Store, "acme")
	require.Len(t, ids, n+2)
	g, ok := r.Get(groups.Key{Tenant: "acme", ID: "g-first"})
	require.True(t, ok)
	require.Equal(t, 1, g.Spec.Size, "the refused change left no trace")
	require.LessOrEqual(t, st.puts.Load(), int32(3), "the held write, then one write for the 21 queued changes")
}

// waitQueued waits until n changes wait for the tenant's next write.
func waitQueued(t *testing.T, r *groups.Registry, tenant string, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return groups.QueuedChanges(r, tenant) == n }, 10*time.Second, time.Millisecond)
}

// BenchmarkParallelUpserts: callers upsert into one tenant that holds
// 1,000 groups (each write encodes the whole document); ns/op is per
// upsert. One caller writes once per upsert; with 32, callers that arrive
// during a write share the next one (group commit).
func BenchmarkParallelUpserts(b *testing.B) {
	for _, callers := range []int{1, 32} {
		b.Run(fmt.Sprintf("callers=%d", callers), func(b *testing.B) {
			ctx := context.Background()
			st := &gatedStore{Store: memstore.New()}
			doc := map[string]any{"version": 2, "groups": map[string]any{}}
			for i := range 1000 {
				doc["groups"].(map[string]any)[fmt.Sprintf("g-%04d", i)] = map[string]any{
					"spec": groups.Spec{Template: "worker", Size: 3, Vars: map[string]string{"role": "web"}}, "etag": fmt.Sprint(i)}
			}
			body, err := json.Marshal(doc)
			require.NoError(b, err)
			_, err = st.Store.Put(ctx, layout.New("").TenantGroups("s1", "acme"), body, objstore.PutOptions{})
			require.NoError(b, err)
			r := groups.NewRegistry(st, layout.New(""), "s1")
			_, err = r.Load(ctx)
			require.NoError(b, err)
			require.Len(b, r.List("acme"), 1000)
			var next atomic.Int64
			upsert := func() {
				i := next.Add(1) % 1000
				if _, _, err := r.Upsert(ctx, groups.Key{Tenant: "acme", ID: fmt.Sprintf("g-%04d", i)}, groups.Spec{Template: "worker", Size: int(i % 7)}, ""); err != nil {
					b.Error(err)
				}
			}
			b.ResetTimer()
			if callers == 1 {
				for range b.N {
					upsert()
				}
			} else {
				b.SetParallelism((callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						upsert()
					}
				})
			}
			b.ReportMetric(float64(st.puts.Load())/float64(b.N), "writes/upsert")
		})
	}
}
