package app

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/storage"
	"github.com/nstance-dev/nstance/internal/testing/hosttools"
)

// TestConfigChecksGateStartup: a document an extra check (the provider
// registry's) rejects is treated like any invalid config: the server stays
// unready and retries until the document passes.
func TestConfigChecksGateStartup(t *testing.T) {
	hosttools.Require(t, "tmux") // testConfig's provider
	store := s3Store(t)
	putConfig(t, store, "c1", "s1")
	var reject atomic.Bool
	var calls atomic.Int32
	reject.Store(true)
	check := func(c *config.Config) config.Errors {
		calls.Add(1)
		if reject.Load() {
			return config.Errors{{Key: "shard.infra.options.x", Reason: "unknown key"}}
		}
		return nil
	}
	a, err := New(Options{
		ServerID: "srv-a", Shard: "s1", Store: store, Keys: layout.New(""), CacheDir: t.TempDir(),
		Bind:           BindOverrides{Health: "127.0.0.1:0"},
		Getenv:         func(k string) string { return map[string]string{"NSTANCE_ENCRYPTION_KEY": testKey}[k] },
		Log:            testr.New(t),
		StorageBackoff: storage.Backoff{Initial: 20 * time.Millisecond, Max: 50 * time.Millisecond},
		ConfigChecks:   []config.Check{check},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	require.Eventually(t, func() bool { return calls.Load() >= 3 && a.Addrs().Health != "" }, 10*time.Second, 10*time.Millisecond,
		"the rejected document is retried")
	require.Equal(t, http.StatusServiceUnavailable, healthCode(t, a.Addrs().Health))
	reject.Store(false)
	require.Eventually(t, func() bool { return healthCode(t, a.Addrs().Health) == http.StatusOK }, 10*time.Second, 20*time.Millisecond)
}
