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

	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

const (
	lease = 400 * time.Millisecond
	renew = 100 * time.Millisecond
	retry = 50 * time.Millisecond
)

func start(t *testing.T, store objstore.Store, id string, leading *atomic.Int32) (*Elector, context.CancelFunc) {
	t.Helper()
	e, err := New(Config{
		Store: store, Key: "cluster/leader.json", ID: id, LeaseDuration: lease, RenewInterval: renew, RetryInterval: retry,
		Log: logr.Discard(),
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
	return e, stop
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
	var leading atomic.Int32
	a, stopA := start(t, store, "a", &leading)
	b, stopB := start(t, store, "b", &leading)

	require.Eventually(t, func() bool { return a.Leading() || b.Leading() }, 2*time.Second, 10*time.Millisecond)
	// For several lease periods exactly one candidate leads.
	deadline := time.Now().Add(3 * lease)
	for time.Now().Before(deadline) {
		require.LessOrEqual(t, leading.Load(), int32(1))
		require.False(t, a.Leading() && b.Leading())
		time.Sleep(5 * time.Millisecond)
	}
	first, second, stopFirst := a, b, stopA
	if b.Leading() {
		first, second, stopFirst = b, a, stopB
	}
	require.True(t, first.Leading())
	// A graceful stop releases the lease: the other takes over well within one lease.
	began := time.Now()
	stopFirst()
	require.Eventually(t, second.Leading, lease, 5*time.Millisecond)
	require.Less(t, time.Since(began), lease)
	require.Equal(t, int64(2), second.Status().Term)
}

func TestTakeoverAfterCrash(t *testing.T) {
	store := memstore.New()
	ctx := context.Background()
	// A holder that crashed: its lease is never renewed nor released.
	body, err := json.Marshal(Lease{Holder: "ghost", RenewedAt: time.Now(), ExpiresAt: time.Now().Add(lease), Term: 7})
	require.NoError(t, err)
	_, err = store.Put(ctx, "cluster/leader.json", body, objstore.PutOptions{IfNoneMatch: true})
	require.NoError(t, err)

	var leading atomic.Int32
	began := time.Now()
	b, _ := start(t, store, "b", &leading)
	time.Sleep(lease / 2)
	require.False(t, b.Leading(), "must not take over a live-looking lease")
	require.Equal(t, "ghost", b.Status().Holder)
	require.Eventually(t, b.Leading, 2*lease, 5*time.Millisecond)
	took := time.Since(began)
	require.GreaterOrEqual(t, took, lease)
	require.Less(t, took, lease+4*retry+renew)
	require.Equal(t, int64(8), b.Status().Term)
}

func TestStepDownWhenLeaseStolen(t *testing.T) {
	store := memstore.New()
	ctx := context.Background()
	var leading atomic.Int32
	a, _ := start(t, store, "a", &leading)
	require.Eventually(t, a.Leading, time.Second, 5*time.Millisecond)
	require.Equal(t, int32(1), leading.Load())
	// Someone overwrites the lease: the next renewal fails its If-Match and a steps down.
	body, err := json.Marshal(Lease{Holder: "intruder", RenewedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour), Term: 99})
	require.NoError(t, err)
	_, err = store.Put(ctx, "cluster/leader.json", body, objstore.PutOptions{})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return !a.Leading() && leading.Load() == 0 }, 2*renew+50*time.Millisecond, 5*time.Millisecond)
	// And it stays down while the intruder's lease keeps changing... here it is static, so after a lease it would retake;
	// check it does not retake sooner than a lease.
	time.Sleep(lease / 2)
	require.False(t, a.Leading())
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
