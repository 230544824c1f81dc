package liveconfig_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/liveconfig"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

// TestRefreshRunsChecks: a refreshed document is held to the extra checks
// (here the provider registry's), and one they reject leaves the running
// config in place with the problems by key path.
func TestRefreshRunsChecks(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	doc := shardtest.Config("c1", "s1", "mock")
	cfg, err := config.Parse([]byte(doc))
	require.NoError(t, err)
	h := liveconfig.New(store, "config/s1.jsonc", cfg, "", time.Time{})
	h.Checks = []config.Check{provider.NewRegistry(mock.Kind()).Check}

	bad := strings.Replace(doc, `"zone": "testa" }`, `"zone": "testa", "options": { "command": "x" } }`, 1)
	require.NotEqual(t, doc, bad)
	_, err = store.Put(ctx, "config/s1.jsonc", []byte(bad), objstore.PutOptions{})
	require.NoError(t, err)
	res := h.Refresh(ctx)
	require.Equal(t, liveconfig.Invalid, res.Outcome, res.Message)
	require.Equal(t, []config.FieldError{{Key: "shard.infra.options.command", Reason: "unknown key"}}, res.Errors)
	require.Same(t, cfg, h.Current(), "the running config is kept")

	good := strings.Replace(doc, `"default_drain_timeout": "30s"`, `"default_drain_timeout": "45s"`, 1)
	_, err = store.Put(ctx, "config/s1.jsonc", []byte(good), objstore.PutOptions{})
	require.NoError(t, err)
	res = h.Refresh(ctx)
	require.Equal(t, liveconfig.Updated, res.Outcome, res.Message)
	require.Equal(t, 45*time.Second, h.Current().Shard.DefaultDrainTimeout.D())
}
