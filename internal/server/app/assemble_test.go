package app_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/app"
	"github.com/nstance-dev/nstance/internal/server/authz"
	"github.com/nstance-dev/nstance/internal/server/cache"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/registration"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// TestAssembleServesOperatorAPIAndMirrorsCache: what Assemble builds serves
// the Operator API, runs the reconciler as the leadership work and mirrors
// instance records into the SQLite cache.
func TestAssembleServesOperatorAPIAndMirrorsCache(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cfg, err := config.Parse([]byte(shardtest.Config("c1", "s1", "mock")))
	require.NoError(t, err)
	db, err := cache.Open(ctx, t.TempDir()+"/cache.sqlite")
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	ca, err := pki.GenerateCA("c1", time.Hour, time.Now())
	require.NoError(t, err)
	_, nonceKey, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	trust, err := pki.NewTrust(ca, nil)
	require.NoError(t, err)
	built, err := app.Assemble(app.Parts{Config: cfg, ConfigETag: "e1", Store: memstore.New(), Keys: layout.New(""), Cache: db,
		Trust: trust, Issuer: &registration.Issuer{CA: ca, ClusterID: "c1", AgentValidity: time.Hour, OperatorValidity: time.Hour},
		NonceKey: nonceKey, Providers: provider.NewRegistry(mock.Kind()), Log: logr.Discard(), Tuning: app.Tuning{ResyncInterval: 100 * time.Millisecond}})
	require.NoError(t, err)
	require.NotNil(t, built.Registration, "with an issuer and a nonce key the Registration service is built")
	term, err := built.NewTerm()
	require.NoError(t, err)
	require.Nil(t, term.Agent, "no workload CA, no Agent service")
	done := make(chan error, 1)
	go func() { done <- built.Lead(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, built.Reconciler.Running, 5*time.Second, time.Millisecond)
	svc := built.Operator

	opCtx := authz.WithIdentity(ctx, pki.Identity{ClusterID: "c1", Tenant: "acme", Role: pki.RoleOperator, ClientID: "op"})
	_, err = svc.UpsertGroup(opCtx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "web", Template: "worker", Size: 2}})
	require.NoError(t, err)
	_, err = svc.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
	require.Error(t, err, "no identity, no answer")

	require.Eventually(t, func() bool {
		es, err := db.List(ctx, app.KindInstance)
		if err != nil || len(es) != 2 {
			return false
		}
		for _, e := range es {
			var r instances.Record
			if json.Unmarshal(e.Body, &r) != nil || r.State != instances.StateRunning || r.Tenant != "acme" {
				return false
			}
		}
		return true
	}, 5*time.Second, 20*time.Millisecond, "instance records mirrored into the SQLite cache")

	st, err := svc.GetConfigStatus(opCtx, &nstancev1.GetConfigStatusRequest{})
	require.NoError(t, err)
	require.Equal(t, "e1", st.GetEtag())
}
