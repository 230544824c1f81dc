package app_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nstance-dev/nstance/internal/admin/clustercmd"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/internal/server/app"
	"github.com/nstance-dev/nstance/internal/server/fleetapp"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// TestServerWithFleetConvergesGroups runs the whole server the way
// cmd/nstance-server does (election, bootstrap, registration, fleet services
// with the reconciler as the leadership work) and checks that a group
// written through the Operator API over mTLS is converged.
func TestServerWithFleetConvergesGroups(t *testing.T) {
	const encKey = "thisisatest32bytekey123456789012"
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	store, keys := memstore.New(), layout.New("")
	_, err := store.Put(ctx, keys.Config("s1"), []byte(shardtest.Config("c1", "s1", "mock")), objstore.PutOptions{})
	require.NoError(t, err)

	a, err := app.New(app.Options{
		ServerID: "srv-1", Shard: "s1", Store: store, Keys: keys,
		Bind:     app.BindOverrides{Health: "127.0.0.1:0"},
		Getenv:   func(k string) string { return map[string]string{"NSTANCE_ENCRYPTION_KEY": encKey}[k] },
		Log:      testr.New(t),
		Services: fleetapp.Factory(fleetapp.Options{Providers: provider.NewRegistry(mock.Kind()), ResyncInterval: 200 * time.Millisecond}),
	})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	require.Eventually(t, a.ServingGRPC, 30*time.Second, 20*time.Millisecond)

	// Register an operator with a nonce minted from the stored key, as
	// `nstance-admin cluster nonce` does.
	t.Setenv("NSTANCE_TEST_KEY", encKey)
	nonceKey, err := clustercmd.LoadNonceKey(ctx, store, keys, secrets.Source{Provider: "env", Env: "NSTANCE_TEST_KEY"})
	require.NoError(t, err)
	tok, err := nonce.Mint(nonceKey, nonce.Claims{Kind: nonce.KindOperator, ClusterID: "c1", Tenant: "acme",
		RegisteredClaims: jwt.RegisteredClaims{Subject: "op-1"}}, time.Minute, time.Now())
	require.NoError(t, err)
	caObj, err := store.Get(ctx, keys.CACert())
	require.NoError(t, err)
	caCert, err := pki.ParseCertificatePEM(caObj.Body)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(caCert)

	addrs := a.Addrs()
	regConn, err := grpc.NewClient(addrs.Registration, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientTLS(pool, nil, "127.0.0.1"))))
	require.NoError(t, err)
	defer regConn.Close()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	pubPEM, err := pki.MarshalPublicKeyPEM(pub)
	require.NoError(t, err)
	reg, err := nstancev1.NewRegistrationServiceClient(regConn).RegisterOperator(ctx, &nstancev1.RegisterOperatorRequest{Nonce: tok, PublicKeyPem: string(pubPEM)})
	require.NoError(t, err)
	leaf, err := pki.ParseCertificatePEM([]byte(reg.GetCertificatePem()))
	require.NoError(t, err)

	opConn, err := grpc.NewClient(addrs.Operator, grpc.WithTransportCredentials(credentials.NewTLS(
		pki.ClientTLS(pool, &tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: priv, Leaf: leaf}, "127.0.0.1"))))
	require.NoError(t, err)
	defer opConn.Close()
	op := nstancev1.NewOperatorServiceClient(opConn)
	_, err = op.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "web", Template: "worker", Size: 3}})
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		resp, err := op.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
		if err != nil || len(resp.GetGroups()) != 1 {
			return false
		}
		return len(resp.GetGroups()[0].GetProviderIds()) == 3
	}, 20*time.Second, 50*time.Millisecond, "the leader's reconciler converges the group to 3 instances")
}
