package election

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

const (
	lease = 400 * time.Millisecond
	renew = 100 * time.Millisecond
	retry = 50 * time.Millisecond
)

// countingStore counts an elector's reads and writes of the lease, so a
// test can wait for it to have looked again instead of sleeping.
type countingStore struct {
	objstore.Store
	gets, puts atomic.Int64
}

func (c *countingStore) Get(ctx context.Context, key string) (*objstore.Object, error) {
	defer c.gets.Add(1)
	return c.Store.Get(ctx, key)
}

func (c *countingStore) Put(ctx context.Context, key string, body []byte, opts objstore.PutOptions) (string, error) {
	defer c.puts.Add(1)
	return c.Store.Put(ctx, key, body, opts)
}

// waitReads waits until the elector behind cs has read the lease n more
// times (each read is one full campaign step).
func waitReads(t *testing.T, cs *countingStore, n int64) {
	t.Helper()
	target := cs.gets.Load() + n
	require.Eventually(t, func() bool { return cs.gets.Load() >= target }, 10*time.Second, time.Millisecond)
}

// start runs a candidate whose clock is clk: every lease decision (expiry,
// how long a foreign lease stayed unchanged) reads that clock, so a test
// that does not step it can never see a takeover by expiry, however slow
// the machine is. Renewal and retry timers are real.
func start(t *testing.T, store objstore.Store, clk *clocktesting.FakeClock, id string, leading *atomic.Int32) (*Elector, *countingStore, context.CancelFunc) {
	t.Helper()
	cs := &countingStore{Store: store}
	e, err := New(Config{
		Store: cs, Key: "cluster/leader.json", ID: id, LeaseDuration: lease, RenewInterval: renew, RetryInterval: retry,
		Log: logr.Discard(), Now: clk.Now,
		OnLeading: func(ctx context.Context, _ int64) {
			leading.Add(1)
			<-ctx.Done()
			leading.Add(-1)
		},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = e.Run(ctx) }()
	stop := func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	return e, cs, stop
}

func TestNewRejectsBadConfig(t *testing.T) {
	base := Config{Store: memstore.New(), Key: "k", ID: "a", LeaseDuration: lease, RenewInterval: renew, RetryInterval: retry}
	for name, mut := range map[string]func(*Config){
		"no store":       func(c *Config) { c.Store = nil },
		"no id":          func(c *Config) { c.ID = "" },
		"zero lease":     func(c *Config) { c.LeaseDuration = 0 },
		"renew >= lease": func(c *Config) { c.RenewInterval = lease },
	} {
		c := base
		mut(&c)
		_, err := New(c)
		require.Error(t, err, name)
	}
}

func TestSingleLeaderAndHandover(t *testing.T) {
	store := memstore.New()
	clk := clocktesting.NewFakeClock(time.Now())
	var leading atomic.Int32
	a, csA, stopA := start(t, store, clk, "a", &leading)
	b, csB, stopB := start(t, store, clk, "b", &leading)

	require.Eventually(t, func() bool { return a.Leading() || b.Leading() }, 10*time.Second, time.Millisecond)
	first, second, firstStore, stopFirst := a, b, csA, stopA
	if b.Leading() {
		first, second, firstStore, stopFirst = b, a, csB, stopB
	}
	// Through several renewals exactly one candidate leads.
	renewals := firstStore.puts.Load() + 5
	for firstStore.puts.Load() < renewals {
		require.LessOrEqual(t, leading.Load(), int32(1))
		require.False(t, a.Leading() && b.Leading())
		require.True(t, first.Leading())
		time.Sleep(time.Millisecond)
	}
	// A graceful stop releases the lease: the other takes over without
	// waiting for it to expire (the clock has not moved at all).
	stopFirst()
	require.Eventually(t, second.Leading, 10*time.Second, time.Millisecond)
	require.Equal(t, int64(2), second.Status().Term)
}

func TestTakeoverAfterCrash(t *testing.T) {
	store := memstore.New()
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Now())
	// A holder that crashed: its lease is never renewed nor released.
	body, err := json.Marshal(Lease{Holder: "ghost", RenewedAt: clk.Now(), ExpiresAt: clk.Now().Add(lease), Term: 7})
	require.NoError(t, err)
	_, err = store.Put(ctx, "cluster/leader.json", body, objstore.PutOptions{IfNoneMatch: true})
	require.NoError(t, err)

	var leading atomic.Int32
	b, cs, _ := start(t, store, clk, "b", &leading)
	waitReads(t, cs, 1)
	require.Equal(t, "ghost", b.Status().Holder)
	// Just short of a lease after b first saw it, the lease still looks
	// alive: b keeps looking and does not take over.
	clk.Step(lease - time.Millisecond)
	waitReads(t, cs, 3)
	require.False(t, b.Leading(), "must not take over a live-looking lease")
	require.Zero(t, cs.puts.Load(), "no takeover attempt")
	// A whole lease unchanged: b takes over at its next look.
	clk.Step(time.Millisecond)
	require.Eventually(t, b.Leading, 10*time.Second, time.Millisecond)
	require.Equal(t, int64(8), b.Status().Term)
}

func TestStepDownWhenLeaseStolen(t *testing.T) {
	store := memstore.New()
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Now())
	var leading atomic.Int32
	a, cs, _ := start(t, store, clk, "a", &leading)
	require.Eventually(t, a.Leading, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return leading.Load() == 1 }, 10*time.Second, time.Millisecond)
	// Someone overwrites the lease: the next renewal fails its If-Match and a steps down.
	body, err := json.Marshal(Lease{Holder: "intruder", RenewedAt: clk.Now(), ExpiresAt: clk.Now().Add(time.Hour), Term: 99})
	require.NoError(t, err)
	puts := cs.puts.Load()
	_, err = store.Put(ctx, "cluster/leader.json", body, objstore.PutOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return !a.Leading() && leading.Load() == 0 }, 10*time.Second, time.Millisecond)
	require.LessOrEqual(t, cs.puts.Load()-puts, int64(2), "stepped down at the first renewal refused after the takeover")
	// The intruder's lease is static: a retakes it once it stayed unchanged
	// for a whole lease on a's clock, never sooner.
	waitReads(t, cs, 3)
	require.False(t, a.Leading())
	clk.Step(lease)
	require.Eventually(t, a.Leading, 10*time.Second, time.Millisecond)
	require.Equal(t, int64(100), a.Status().Term)
}

// run starts an elector and returns it with a channel that receives Run's result.
func run(t *testing.T, store objstore.Store, id, incarnation string, leading *atomic.Int32) (*Elector, <-chan error) {
	t.Helper()
	e, err := New(Config{
		Store: store, Key: "cluster/leader.json", ID: id, Incarnation: incarnation, LeaseDuration: lease, RenewInterval: renew, RetryInterval: retry,
		Log: logr.Discard(),
		OnLeading: func(ctx context.Context, _ int64) {
			leading.Add(1)
			<-ctx.Done()
			leading.Add(-1)
		},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done, finished := make(chan error, 1), make(chan struct{})
	go func() { done <- e.Run(ctx); close(finished) }()
	t.Cleanup(func() { cancel(); <-finished })
	return e, done
}

func TestDuplicateIDIsRefused(t *testing.T) {
	store := memstore.New()
	var leading atomic.Int32
	a, aDone := run(t, store, "srv", "", &leading)
	require.Eventually(t, a.Leading, 2*time.Second, 5*time.Millisecond)

	// A second process with the same id: it sees the lease under its id
	// renewed by another incarnation and refuses to campaign.
	b, bDone := run(t, store, "srv", "", &leading)
	require.NotEqual(t, a.Incarnation(), b.Incarnation())
	var err error
	deadline := time.After(lease + 4*renew)
	for err == nil {
		select {
		case err = <-bDone:
		case <-deadline:
			t.Fatal("the duplicate did not notice")
		case <-time.After(2 * time.Millisecond):
			require.LessOrEqual(t, leading.Load(), int32(1), "both led")
			require.False(t, b.Leading())
		}
	}
	require.ErrorIs(t, err, ErrDuplicateID)
	require.Contains(t, err.Error(), a.Incarnation())
	// The first one is untouched.
	require.True(t, a.Leading())
	time.Sleep(2 * renew)
	require.True(t, a.Leading())
	select {
	case err := <-aDone:
		t.Fatalf("the leader stopped: %v", err)
	default:
	}
}

func TestRestartAfterCrashTakesOverItsOldLeaseAfterALease(t *testing.T) {
	store := memstore.New()
	ctx := context.Background()
	// The previous run of "srv" crashed while leading.
	body, err := json.Marshal(Lease{Holder: "srv", Incarnation: "dead-process", RenewedAt: time.Now(), ExpiresAt: time.Now().Add(lease), Term: 3})
	require.NoError(t, err)
	_, err = store.Put(ctx, "cluster/leader.json", body, objstore.PutOptions{IfNoneMatch: true})
	require.NoError(t, err)

	var leading atomic.Int32
	began := time.Now()
	e, done := run(t, store, "srv", "", &leading)
	time.Sleep(lease / 2)
	require.False(t, e.Leading(), "a lease under our id from another process is not ours")
	require.Eventually(t, e.Leading, 2*lease, 5*time.Millisecond)
	require.GreaterOrEqual(t, time.Since(began), lease)
	require.Equal(t, int64(4), e.Status().Term)
	select {
	case err := <-done:
		t.Fatalf("Run returned: %v", err)
	default:
	}
	obj, err := store.Get(ctx, "cluster/leader.json")
	require.NoError(t, err)
	var l Lease
	require.NoError(t, json.Unmarshal(obj.Body, &l))
	require.Equal(t, e.Incarnation(), l.Incarnation)
}

func TestOwnIncarnationIsRetakenAtOnce(t *testing.T) {
	store := memstore.New()
	body, err := json.Marshal(Lease{Holder: "srv", Incarnation: "me", RenewedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour), Term: 5})
	require.NoError(t, err)
	_, err = store.Put(context.Background(), "cluster/leader.json", body, objstore.PutOptions{IfNoneMatch: true})
	require.NoError(t, err)
	var leading atomic.Int32
	e, _ := run(t, store, "srv", "me", &leading)
	require.Eventually(t, e.Leading, lease/2, 5*time.Millisecond)
	require.Equal(t, int64(6), e.Status().Term)
}

// blockingStore blocks every lease write while blocked is set, like a
// leader cut off from storage by a blackholed connection: the write
// returns only when its context ends.
type blockingStore struct {
	objstore.Store
	blocked atomic.Bool
	puts    atomic.Int64
}

func (b *blockingStore) Put(ctx context.Context, key string, body []byte, opts objstore.PutOptions) (string, error) {
	if b.blocked.Load() {
		<-ctx.Done()
		return "", ctx.Err()
	}
	defer b.puts.Add(1)
	return b.Store.Put(ctx, key, body, opts)
}

// A leader cut off from storage stops acting at its renew deadline by its
// own clock, before the lease it last wrote can look dead to a standby
// (lease plus clock-skew allowance), whatever its blocked write does; and
// Check refuses from that instant even if the loop has not run yet.
func TestLeaderStopsBeforeItsLeaseCanExpire(t *testing.T) {
	const skew = 50 * time.Millisecond
	store := memstore.New()
	clk := clocktesting.NewFakeClock(time.Now())
	bs := &blockingStore{Store: store}
	var cancelled atomic.Bool
	a, err := New(Config{
		Store: bs, Key: "shard/s1/leader.json", ID: "a", LeaseDuration: lease, RenewInterval: renew, RetryInterval: retry,
		MaxClockSkew: skew, Log: logr.Discard(), Now: clk.Now,
		OnLeading: func(ctx context.Context, _ int64) { <-ctx.Done(); cancelled.Store(true) },
	})
	require.NoError(t, err)
	require.Equal(t, lease*2/3, a.cfg.RenewDeadline, "default renew deadline")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = a.Run(ctx) }()
	require.Eventually(t, a.Leading, 10*time.Second, time.Millisecond)
	// At least one renewal succeeded at the frozen clock: ValidUntil is
	// the acquisition/renewal time plus the deadline.
	require.Eventually(t, func() bool { return bs.puts.Load() >= 2 }, 10*time.Second, time.Millisecond)
	st := a.Status()
	require.Equal(t, clk.Now().Add(a.cfg.RenewDeadline), st.ValidUntil)
	require.NoError(t, a.Check(st.Term))
	require.ErrorIs(t, a.Check(st.Term+1), ErrNotLeader, "another term is not ours")
	bctx, bcancel, err := a.Bound(context.Background())
	require.NoError(t, err)
	dl, ok := bctx.Deadline()
	require.True(t, ok)
	require.WithinDuration(t, time.Now().Add(a.cfg.RenewDeadline), dl, 200*time.Millisecond)
	bcancel()

	bs.blocked.Store(true)
	// Just before the deadline it still acts.
	clk.Step(a.cfg.RenewDeadline - time.Millisecond)
	require.NoError(t, a.Check(0))
	// At the deadline Check refuses at once: no goroutine has to run first.
	clk.Step(time.Millisecond)
	require.ErrorIs(t, a.Check(0), ErrNotLeader)
	require.False(t, a.Leading())
	_, _, err = a.Bound(context.Background())
	require.ErrorIs(t, err, ErrNotLeader)
	// And the work is cancelled (the blocked write's context ends at the
	// deadline; the expiry timer fires).
	require.Eventually(t, cancelled.Load, 10*time.Second, time.Millisecond)
	require.Less(t, a.cfg.RenewDeadline, lease, "stopped while the lease is valid on any clock within the skew")
}

// A standby waits a whole lease plus the clock-skew allowance after it last
// saw the lease change, never less.
func TestStandbyWaitsLeasePlusSkew(t *testing.T) {
	const skew = 100 * time.Millisecond
	store := memstore.New()
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Now())
	body, err := json.Marshal(Lease{Holder: "ghost", RenewedAt: clk.Now(), ExpiresAt: clk.Now().Add(lease), Term: 3})
	require.NoError(t, err)
	_, err = store.Put(ctx, "cluster/leader.json", body, objstore.PutOptions{IfNoneMatch: true})
	require.NoError(t, err)
	cs := &countingStore{Store: store}
	b, err := New(Config{Store: cs, Key: "cluster/leader.json", ID: "b", LeaseDuration: lease, RenewInterval: renew,
		RetryInterval: retry, MaxClockSkew: skew, Log: logr.Discard(), Now: clk.Now})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go func() { _ = b.Run(rctx) }()
	waitReads(t, cs, 1)
	clk.Step(lease + skew - time.Millisecond)
	waitReads(t, cs, 3)
	require.False(t, b.Leading(), "a lease that may still be acted on is not taken over")
	require.Zero(t, cs.puts.Load())
	clk.Step(time.Millisecond)
	require.Eventually(t, b.Leading, 10*time.Second, time.Millisecond)
}

func TestUnparsableLeaseIsNotAReleasedLease(t *testing.T) {
	store := memstore.New()
	ctx := context.Background()
	_, err := store.Put(ctx, "cluster/leader.json", []byte(`{"holder": "x", "term": `), objstore.PutOptions{IfNoneMatch: true})
	require.NoError(t, err)
	clk := clocktesting.NewFakeClock(time.Now())
	var leading atomic.Int32
	b, cs, _ := start(t, store, clk, "b", &leading)
	waitReads(t, cs, 3)
	clk.Step(10 * lease)
	waitReads(t, cs, 3)
	require.False(t, b.Leading())
	require.Zero(t, cs.puts.Load(), "never overwritten")
}

func TestRenewDeadlineBounds(t *testing.T) {
	base := Config{Store: memstore.New(), Key: "k", ID: "a", LeaseDuration: lease, RenewInterval: renew, RetryInterval: retry}
	for name, d := range map[string]time.Duration{"equal to lease": lease, "longer than lease": 2 * lease, "equal to renew": renew} {
		c := base
		c.RenewDeadline = d
		_, err := New(c)
		require.Error(t, err, name)
	}
	c := base
	c.MaxClockSkew = -time.Second
	_, err := New(c)
	require.Error(t, err)
	require.Equal(t, 250*time.Millisecond, config.DefaultRenewDeadline(300*time.Millisecond, 200*time.Millisecond))
}

// gatedStore can hold one lease read until released, like a read stuck in
// a partition.
type gatedStore struct {
	countingStore
	mu      sync.Mutex
	hold    chan struct{} // closed to release the held read
	entered chan struct{} // closed when a read is being held
}

func (g *gatedStore) holdNextRead() (entered <-chan struct{}, release func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.hold, g.entered = make(chan struct{}), make(chan struct{})
	hold := g.hold
	return g.entered, func() { close(hold) }
}

func (g *gatedStore) Get(ctx context.Context, key string) (*objstore.Object, error) {
	g.mu.Lock()
	hold, entered := g.hold, g.entered
	g.hold, g.entered = nil, nil
	g.mu.Unlock()
	if hold != nil {
		close(entered)
		<-hold
	}
	return g.countingStore.Get(ctx, key)
}

// A read that blocked while time passed must not count that time as the
// lease having been seen unchanged: the lease it returns was just seen.
func TestBlockedReadDoesNotAgeTheObservation(t *testing.T) {
	const skew = 100 * time.Millisecond
	store := memstore.New()
	ctx := context.Background()
	clk := clocktesting.NewFakeClock(time.Now())
	put := func(renewed time.Time) {
		body, err := json.Marshal(Lease{Holder: "ghost", RenewedAt: renewed, ExpiresAt: renewed.Add(time.Hour), Term: 3})
		require.NoError(t, err)
		_, err = store.Put(ctx, "cluster/leader.json", body, objstore.PutOptions{})
		require.NoError(t, err)
	}
	put(clk.Now())
	gs := &gatedStore{countingStore: countingStore{Store: store}}
	b, err := New(Config{Store: gs, Key: "cluster/leader.json", ID: "b", LeaseDuration: lease, RenewInterval: renew,
		RetryInterval: retry, MaxClockSkew: skew, Log: logr.Discard(), Now: clk.Now})
	require.NoError(t, err)
	rctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go func() { _ = b.Run(rctx) }()
	waitReads(t, &gs.countingStore, 1)

	entered, release := gs.holdNextRead()
	<-entered
	// While the read hangs the holder renews once and a whole lease passes.
	put(clk.Now().Add(time.Millisecond))
	clk.Step(lease + skew)
	release()
	waitReads(t, &gs.countingStore, 3)
	require.False(t, b.Leading(), "the renewed lease was seen only now")
	require.Zero(t, gs.puts.Load())
	clk.Step(lease + skew)
	require.Eventually(t, b.Leading, 10*time.Second, time.Millisecond)
}
