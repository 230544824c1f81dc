package app

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/storage"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/dirstore"
)

// listCounting counts listings of nonce-marker prefixes.
type listCounting struct {
	objstore.Store
	nonceLists atomic.Int32
}

func (s *listCounting) List(ctx context.Context, prefix string) ([]objstore.ObjectInfo, error) {
	if strings.Contains(prefix, "nonces") {
		s.nonceLists.Add(1)
	}
	return s.Store.List(ctx, prefix)
}

func runWithSweep(t *testing.T, store objstore.Store, every time.Duration) *running {
	t.Helper()
	a, err := New(Options{
		ServerID: "srv", Shard: "s1", Store: store, Keys: layout.New(""), CacheDir: t.TempDir(),
		Bind:               BindOverrides{Health: "127.0.0.1:0"},
		Getenv:             func(k string) string { return map[string]string{"NSTANCE_ENCRYPTION_KEY": testKey}[k] },
		Log:                testr.NewWithOptions(t, testr.Options{Verbosity: 0}),
		StorageBackoff:     storage.Backoff{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond},
		NonceSweepInterval: every,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{app: a, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- a.Run(ctx) }()
	t.Cleanup(func() { _ = r.stop() })
	return r
}

// TestNonceMarkersAreSweptNotListedAtTakeover: taking over the shard lists
// no nonce markers; the background sweep deletes the agent and operator
// markers whose nonce has expired and keeps the others: young ones, one
// written long ago for a nonce that another shard's longer
// nonce_max_lifetime still accepts, and one of an older version that
// records no expiry (kept for config.MaxNonceMaxLifetime).
func TestNonceMarkersAreSweptNotListedAtTakeover(t *testing.T) {
	dir := t.TempDir()
	ds, err := dirstore.Open(dir)
	require.NoError(t, err)
	store := &listCounting{Store: ds}
	putConfig(t, store, "c1", "s1")
	keys := layout.New("")
	ctx := context.Background()
	old := []string{keys.ShardNonce("s1", "old-agent"), keys.ClusterNonce("old-operator")}
	young := []string{keys.ShardNonce("s1", "young-agent"), keys.ClusterNonce("young-operator"), keys.ShardNonce("s2", "other-shard")}
	long, legacy := keys.ClusterNonce("long-operator"), keys.ClusterNonce("legacy-operator")
	past := time.Now().Add(-25 * time.Hour)
	expires := map[string]time.Time{long: time.Now().Add(5 * 24 * time.Hour)}
	for _, k := range old {
		expires[k] = past.Add(time.Hour)
	}
	for _, k := range young {
		expires[k] = time.Now().Add(time.Hour)
	}
	for _, k := range append(append([]string{long, legacy}, old...), young...) {
		body := []byte(`{}`)
		if exp, ok := expires[k]; ok {
			body = []byte(`{"expires_at":"` + exp.UTC().Format(time.RFC3339) + `"}`)
		}
		_, err := store.Put(ctx, k, body, objstore.PutOptions{IfNoneMatch: true})
		require.NoError(t, err)
	}
	// Used 25 hours ago: the old ones expired 24 hours ago; the long one
	// (minted for 6 days, accepted by a shard that allows that) has not.
	for _, k := range append(append([]string{long, legacy}, old...), keys.ShardNonce("s2", "other-shard")) {
		require.NoError(t, os.Chtimes(filepath.Join(dir, filepath.FromSlash(k)), past, past))
	}

	first := runWithSweep(t, store, time.Hour)
	waitServing(t, 30*time.Second, first)
	require.Zero(t, store.nonceLists.Load(), "leadership start lists no nonce markers")
	require.NoError(t, first.stop())

	second := runWithSweep(t, store, 100*time.Millisecond)
	waitServing(t, 30*time.Second, second)
	require.Eventually(t, func() bool {
		for _, k := range old {
			if _, err := store.Head(ctx, k); err == nil {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "old markers are swept")
	for _, k := range append(young, long, legacy) {
		_, err := store.Head(ctx, k)
		require.NoError(t, err, "%s stays (not expired, no expiry recorded, or another shard's)", k)
	}
}
