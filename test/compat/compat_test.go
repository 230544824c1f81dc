package compat

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/election"
	"github.com/nstance-dev/nstance/internal/storage"
	"github.com/nstance-dev/nstance/internal/testing/gcsemu"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
	"github.com/nstance-dev/nstance/internal/testing/s3servers"
	"github.com/nstance-dev/nstance/internal/testing/toolbin"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/gcsstore"
	"github.com/nstance-dev/nstance/pkg/objstore/objstoretest"
)

// server is a running store: NewBucket makes an empty bucket and returns a
// store over it.
type server interface {
	NewBucket(t *testing.T) objstore.Store
}

// backend is one column of the matrix.
type backend struct {
	name string
	tool toolbin.Tool
	// always runs it without NSTANCE_COMPAT (building it if needed);
	// inMakeTest runs it without NSTANCE_COMPAT when its build is cached
	// (s3servers.Gate).
	always, inMakeTest bool
	start              func(t *testing.T, bin string) server
	// probeRefuses, when not empty, is the reason the start-up probe
	// refuses this store (its error must contain it); the contract and the
	// election are then not run, as the server would not run on it.
	probeRefuses string
}

var backends = append([]backend{{name: "fake-gcs-server", tool: toolbin.FakeGCSServer, always: true, start: startFakeGCS}}, s3Backends()...)

// s3Backends are the S3 implementations of s3servers.
func s3Backends() []backend {
	var out []backend
	for _, k := range s3servers.All {
		out = append(out, backend{name: k.Name, tool: k.Tool, inMakeTest: k.InMakeTest, start: func(t *testing.T, bin string) server {
			return s3Server{k.Start(t, bin)}
		}})
	}
	return out
}

func TestCompat(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			bin := s3servers.Require(t, b.tool, b.name, b.always, b.inMakeTest)
			srv := b.start(t, bin)
			runMatrix(t, srv, b)
		})
	}
}

func runMatrix(t *testing.T, srv server, b backend) {
	probed := t.Run("probe", func(t *testing.T) {
		s := srv.NewBucket(t)
		err := storage.ProbeConditionalWrites(context.Background(), s, "shard/s1/probe/compat-1")
		if b.probeRefuses != "" {
			require.ErrorIs(t, err, storage.ErrNoConditionalWrites)
			require.ErrorContains(t, err, b.probeRefuses)
			t.Logf("%s: the start-up probe refuses it: %v", b.name, err)
			return
		}
		require.NoError(t, err, "the start-up probe")
		_, err = s.Head(context.Background(), "shard/s1/probe/compat-1")
		require.ErrorIs(t, err, objstore.ErrNotFound, "the probe object is removed")
	})
	if !probed || b.probeRefuses != "" {
		return
	}
	t.Run("contract", func(t *testing.T) {
		objstoretest.Run(t, srv.NewBucket)
	})
	t.Run("election", func(t *testing.T) {
		testElection(t, srv.NewBucket(t))
	})
}

// cuttable fails every call while cut is set, like a network partition
// between one server and the store.
type cuttable struct {
	objstore.Store
	cut atomic.Bool
}

var errCut = errors.New("cut off from storage")

func (c *cuttable) Get(ctx context.Context, key string) (*objstore.Object, error) {
	if c.cut.Load() {
		return nil, errCut
	}
	return c.Store.Get(ctx, key)
}

func (c *cuttable) Head(ctx context.Context, key string) (*objstore.ObjectInfo, error) {
	if c.cut.Load() {
		return nil, errCut
	}
	return c.Store.Head(ctx, key)
}

func (c *cuttable) Put(ctx context.Context, key string, body []byte, o objstore.PutOptions) (string, error) {
	if c.cut.Load() {
		return "", errCut
	}
	return c.Store.Put(ctx, key, body, o)
}

func (c *cuttable) Delete(ctx context.Context, key string) error {
	if c.cut.Load() {
		return errCut
	}
	return c.Store.Delete(ctx, key)
}

func (c *cuttable) List(ctx context.Context, prefix string) ([]objstore.ObjectInfo, error) {
	if c.cut.Load() {
		return nil, errCut
	}
	return c.Store.List(ctx, prefix)
}

// terms records who leads when; overlap is the longest time two led at once.
type terms struct {
	mu      sync.Mutex
	leading map[string]time.Time // id -> since
	overlap time.Duration
	starts  int
}

func (tr *terms) begin(id string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.leading[id] = time.Now()
	tr.starts++
}

func (tr *terms) end(id string) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	since := tr.leading[id]
	delete(tr.leading, id)
	for _, other := range tr.leading {
		// The other began while id still led: they overlapped from then.
		if other.After(since) {
			tr.overlap = max(tr.overlap, time.Since(other))
		}
	}
}

func (tr *terms) leader() (string, int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var id string
	for k := range tr.leading {
		id = k
	}
	return id, len(tr.leading)
}

// testElection runs two electors on one lease and cuts the leader off from
// storage twice: the other takes over each time, never while the cut-off
// one still acts (zero overlap), and exactly one leads at the end.
func testElection(t *testing.T, store objstore.Store) {
	const (
		lease = 3 * time.Second
		renew = 300 * time.Millisecond
		retry = 150 * time.Millisecond
	)
	tr := &terms{leading: map[string]time.Time{}}
	stores := map[string]*cuttable{}
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, id := range []string{"a", "b"} {
		cs := &cuttable{Store: store}
		stores[id] = cs
		e, err := election.New(election.Config{
			Store: cs, Key: "cluster/leader.json", ID: id, LeaseDuration: lease, RenewInterval: renew, RetryInterval: retry,
			Log: logr.Discard(),
			OnLeading: func(ctx context.Context, _ int64) {
				tr.begin(id)
				<-ctx.Done()
				tr.end(id)
			},
		})
		require.NoError(t, err)
		wg.Go(func() { _ = e.Run(ctx) })
	}
	oneLeader := func() string {
		var id string
		proctest.Eventually(t, "exactly one elector leads", 30*time.Second, func() bool {
			var n int
			id, n = tr.leader()
			return n == 1
		})
		return id
	}
	leader := oneLeader()
	for run := 1; run <= 2; run++ {
		other := map[string]string{"a": "b", "b": "a"}[leader]
		stores[leader].cut.Store(true)
		proctest.Eventually(t, fmt.Sprintf("run %d: %s takes over from %s", run, other, leader), 30*time.Second, func() bool {
			id, n := tr.leader()
			return n == 1 && id == other
		})
		stores[leader].cut.Store(false)
		tr.mu.Lock()
		ov := tr.overlap
		tr.mu.Unlock()
		t.Logf("run %d: %s cut off, %s leads; overlap %s", run, leader, other, ov)
		require.Zero(t, ov, "run %d: two electors led at once", run)
		leader = other
	}
	// Healed, the old leader stays a standby: one leader for a few renewals.
	deadline := time.Now().Add(3 * renew)
	for time.Now().Before(deadline) {
		id, n := tr.leader()
		require.Equal(t, 1, n)
		require.Equal(t, leader, id)
		time.Sleep(renew / 3)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	require.Zero(t, tr.overlap)
	require.Equal(t, 3, tr.starts, "one term per handover")
}

// gcsServer is fake-gcs-server.
type gcsServer struct{ emu *gcsemu.Server }

func startFakeGCS(t *testing.T, _ string) server { return gcsServer{gcsemu.Start(t)} }

func (g gcsServer) NewBucket(t *testing.T) objstore.Store {
	s, err := gcsstore.NewWithClient(g.emu.Client(t), g.emu.NewBucket(t), "")
	require.NoError(t, err)
	return s
}

// s3Server is an S3 server of s3servers.
type s3Server struct{ *s3servers.Server }

func (s s3Server) NewBucket(t *testing.T) objstore.Store { return s.Store(t, s.Server.NewBucket(t)) }

// The overlap measure sees two terms that overlap, and not two that follow
// each other.
func TestTermsOverlap(t *testing.T) {
	tr := &terms{leading: map[string]time.Time{}}
	tr.begin("a")
	tr.end("a")
	tr.begin("b")
	require.Zero(t, tr.overlap, "a ended before b began")
	tr.begin("a")
	time.Sleep(time.Millisecond)
	tr.end("b")
	require.Positive(t, tr.overlap, "a began while b still led")
}
