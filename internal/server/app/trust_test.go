package app

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/server/election"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/storage"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

// TestDuplicateServerIDIsRefused: a second server started with the id of a
// running one stops with ErrDuplicateID; the first keeps serving.
func TestDuplicateServerIDIsRefused(t *testing.T) {
	store := s3Store(t)
	putConfig(t, store, "c1", "s1")
	first := startApp(t, store, "srv-a", "s1")
	waitServing(t, 15*time.Second, first)

	second := startApp(t, store, "srv-a", "s1")
	var err error
	select {
	case err = <-second.done:
	case <-time.After(15 * time.Second):
		t.Fatal("the server with a duplicate id kept running")
	}
	second.once.Do(func() { second.cancel(); second.err = err }) // Run already returned
	require.ErrorIs(t, err, election.ErrDuplicateID)
	require.Contains(t, err.Error(), "give each server its own --id")
	require.False(t, second.app.ServingGRPC())
	for i := 0; i < 10; i++ {
		require.True(t, first.app.ServingGRPC(), "the first server is undisturbed")
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPrintableKeyWarning: a printable encryption key draws a loud warning
// with a non-development provider, and none with a development one.
func TestPrintableKeyWarning(t *testing.T) {
	for _, tc := range []struct {
		provider string
		loud     bool
	}{{"cloud", true}, {"mock", false}} {
		t.Run(tc.provider, func(t *testing.T) {
			store := s3Store(t)
			cfg := strings.Replace(string(testConfig("c1", "s1")), `"provider": "mock"`, `"provider": "`+tc.provider+`"`, 1)
			_, err := store.Put(context.Background(), layout.New("").Config("s1"), []byte(cfg), objstore.PutOptions{})
			require.NoError(t, err)
			var mu sync.Mutex
			var lines []string
			log := funcr.New(func(prefix, args string) { mu.Lock(); lines = append(lines, prefix+" "+args); mu.Unlock() }, funcr.Options{})
			a, err := New(Options{
				ServerID: "srv", Shard: "s1", Store: store, Keys: layout.New(""), Bind: BindOverrides{Health: "127.0.0.1:0"},
				Getenv: func(k string) string { return map[string]string{"NSTANCE_ENCRYPTION_KEY": testKey}[k] },
				Log:    log, StorageBackoff: storage.Backoff{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond},
				// No "cloud" provider exists: the warning is the point, the instances run nowhere.
				Provider: mock.New(),
			})
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- a.Run(ctx) }()
			t.Cleanup(func() {
				cancel()
				if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("Run: %v", err)
				}
			})
			require.Eventually(t, a.Ready, 15*time.Second, 20*time.Millisecond)
			mu.Lock()
			all := strings.Join(lines, "\n")
			mu.Unlock()
			if tc.loud {
				require.Contains(t, all, "WARNING: the encryption key is printable text")
				require.Contains(t, all, `"error"="weak encryption key"`)
			} else {
				require.NotContains(t, all, "WARNING")
			}
		})
	}
}
