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
// markers older than the longest nonce lifetime and keeps younger ones.
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
	for _, k := range append(append([]string{}, old...), young...) {
		_, err := store.Put(ctx, k, []byte(`{}`), objstore.PutOptions{IfNoneMatch: true})
		require.NoError(t, err)
	}
	// Used 25 hours ago: past the default 24h lifetime and the allowances.
	past := time.Now().Add(-25 * time.Hour)
	for _, k := range append(append([]string{}, old...), keys.ShardNonce("s2", "other-shard")) {
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
	for _, k := range young {
		_, err := store.Head(ctx, k)
		require.NoError(t, err, "%s stays (young, or another shard's)", k)
	}
}
