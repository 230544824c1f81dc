package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/server/agentapi"
	"github.com/nstance-dev/nstance/internal/server/election"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// writeShardLease writes the shard lease as held by another server, valid
// until the time given (in the past: a standby takes over at its next try).
func writeShardLease(ctx context.Context, store objstore.Store, shard string, until time.Time) error {
	key := layout.New("").ShardLeader(shard)
	var (
		lease election.Lease
		opts  objstore.PutOptions
	)
	obj, err := store.Get(ctx, key)
	switch {
	case err == nil:
		if err := json.Unmarshal(obj.Body, &lease); err != nil {
			return err
		}
		opts.IfMatch = obj.ETag
	case errors.Is(err, objstore.ErrNotFound):
		opts.IfNoneMatch = true
	default:
		return err
	}
	body, err := json.Marshal(election.Lease{Holder: "srv-other", Incarnation: "x", RenewedAt: time.Now(), ExpiresAt: until, Term: lease.Term + 1})
	if err != nil {
		return err
	}
	_, err = store.Put(ctx, key, body, opts)
	return err
}

// holdShardLease plays another server that holds the shard lease and
// renews it (a lease left unrenewed is taken over) until release, which
// leaves it expired.
func holdShardLease(t *testing.T, store objstore.Store, shard string) (release func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	// The first write must land before the caller goes on.
	require.Eventually(t, func() bool { return writeShardLease(ctx, store, shard, time.Now().Add(time.Hour)) == nil }, 10*time.Second, 10*time.Millisecond)
	go func() {
		defer close(done)
		_ = wait.PollUntilContextCancel(ctx, 200*time.Millisecond, false, func(ctx context.Context) (bool, error) {
			_ = writeShardLease(ctx, store, shard, time.Now().Add(time.Hour)) // a lost race is retried next time
			return false, nil
		})
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			cancel()
			<-done
			require.Eventually(t, func() bool {
				return writeShardLease(context.Background(), store, shard, time.Now().Add(-time.Hour)) == nil
			}, 10*time.Second, 10*time.Millisecond)
		})
	}
}

// TestLeadLoseLeadAgain: one process stands by, leads, loses the lease (as
// after a partition: another server took it), and leads again. Everything
// of a term is built for it and gone with it: the first term's goroutines
// are gone once it ends (the count is back to the standby's), and the
// second term starts with its own Agent service, an empty live table and
// key store, an empty queue and new gRPC servers, although the first term
// held reports and keys of 200 instances.
func TestLeadLoseLeadAgain(t *testing.T) {
	store := memstore.New()
	putConfig(t, store, "c1", "s1")
	release := holdShardLease(t, store, "s1")
	t.Cleanup(release)
	r := startApp(t, store, "srv-a", "s1")
	require.Eventually(t, func() bool { return r.app.Ready() && r.app.Assembly() != nil }, 30*time.Second, 20*time.Millisecond, "a ready standby")
	require.False(t, r.app.ServingGRPC())
	baseline, standbyStacks := runtime.NumGoroutine(), goroutines()
	t.Logf("standby goroutines: %d", baseline)
	built := r.app.Assembly()

	// Term 1.
	release()
	waitServing(t, 30*time.Second, r)
	r.app.mu.Lock()
	first := r.app.term
	r.app.mu.Unlock()
	require.NotNil(t, first)
	t1 := built.Term()
	require.NotNil(t, t1)
	ctx := context.Background()
	for i := range 200 {
		ref := agentapi.Ref{InstanceID: fmt.Sprintf("i-%04d", i), Tenant: "default", Shard: "s1"}
		require.NoError(t, t1.Keys.PutKey(ctx, ref, "k", agentapi.StoredKey{Type: nstancev1.KeyType_KEY_TYPE_ED25519, PublicKeyPEM: "pem"}))
		require.NoError(t, t1.Agents.RecordHealth(ctx, ref, &nstancev1.HealthReport{AgentVersion: "v1"}, time.Now()))
	}
	leading := runtime.NumGoroutine()
	t.Logf("leading goroutines: %d", leading)
	require.Greater(t, leading, baseline, "a term runs goroutines of its own (workers, sweep, gRPC)")

	lose := func() {
		t.Helper()
		release = holdShardLease(t, store, "s1")
		t.Cleanup(release)
		require.Eventually(t, func() bool {
			r.app.mu.Lock()
			defer r.app.mu.Unlock()
			return r.app.term == nil && r.app.servingSince.IsZero()
		}, 10*time.Second, 20*time.Millisecond, "the term ends")
		require.Nil(t, built.Term(), "no term is reachable from the assembly")
		require.False(t, built.Reconciler.Running())
		if !goroutinesAtMost(baseline, 10*time.Second) {
			t.Fatalf("the term's goroutines are not gone: %d, standby had %d\nstandby:\n%s\nnow:\n%s", runtime.NumGoroutine(), baseline, standbyStacks, goroutines())
		}
	}
	lose()

	// Term 2.
	release()
	waitServing(t, 30*time.Second, r)
	r.app.mu.Lock()
	second := r.app.term
	r.app.mu.Unlock()
	t2 := built.Term()
	require.NotNil(t, second)
	require.NotNil(t, t2)
	require.NotSame(t, first, second)
	require.NotSame(t, first.grpc, second.grpc, "new gRPC servers")
	require.NotSame(t, t1.Agent, t2.Agent, "a new Agent service")
	require.Zero(t, t2.Agents.Len(), "the live table starts empty")
	require.Zero(t, t2.Keys.Len(), "the key store starts empty")
	require.Zero(t, built.Reconciler.QueueLen(), "the queue starts empty (no groups)")
	require.Empty(t, built.Reconciler.ReportedVersion("i-0000"), "nothing reported in this term")
	lose()
}

// goroutines is the goroutine profile in text (to show what a leak is).
func goroutines() string {
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
	return b.String()
}

// goroutinesAtMost polls (on the caller's goroutine, which the baseline
// counted too) until at most n goroutines run, or the timeout passes.
func goroutinesAtMost(n int, timeout time.Duration) bool {
	for deadline := time.Now().Add(timeout); ; time.Sleep(20 * time.Millisecond) {
		if runtime.NumGoroutine() <= n {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}
