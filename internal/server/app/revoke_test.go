package app

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/pkg/objstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// TestDeletedOperatorRecordAcrossLeaders runs two real servers of one shard
// on dev-s3: an operator registered through the Registration port loses
// RenewCertificate and new connections as soon as its record is deleted,
// every RPC on its open connection within one revocation sync, and the next leader refuses it too,
// while another operator keeps working throughout.
func TestDeletedOperatorRecordAcrossLeaders(t *testing.T) {
	store := s3Store(t)
	cfg := strings.Replace(string(testConfig("c1", "s1")), `"lease_duration": "2s"`, `"lease_duration": "2m"`, 1)
	cfg = strings.Replace(cfg, `"shard": {`, `"certificates": {"revocation_sync_interval": "100ms"}, "shard": {`, 1)
	_, err := store.Put(context.Background(), layout.New("").Config("s1"), []byte(cfg), objstore.PutOptions{})
	require.NoError(t, err)
	a := startApp(t, store, "srv-a", "s1")
	leader := waitServing(t, 15*time.Second, a)
	ca, nonceKey := clusterMaterial(t, store)
	reg := registrationClient(t, ca, leader.app.Addrs().Registration)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	register := func(id string) *tls.Certificate {
		tok, err := nonce.Mint(nonceKey, nonce.Claims{Kind: nonce.KindOperator, ClusterID: "c1", Tenant: "default",
			RegisteredClaims: jwt.RegisteredClaims{Subject: id}}, time.Hour, time.Now())
		require.NoError(t, err)
		priv, pubPEM := newKeyPEM(t)
		resp, err := reg.RegisterOperator(ctx, &nstancev1.RegisterOperatorRequest{Nonce: tok, PublicKeyPem: pubPEM})
		require.NoError(t, err)
		keyPEM, err := pki.MarshalPrivateKeyPEM(priv)
		require.NoError(t, err)
		cert, err := tls.X509KeyPair([]byte(resp.GetCertificatePem()), keyPEM)
		require.NoError(t, err)
		return &cert
	}
	certA, certB := register("op-a"), register("op-b")
	opA := operatorClient(t, ca, leader.app.Addrs().Operator, certA)
	opB := operatorClient(t, ca, leader.app.Addrs().Operator, certB)
	_, err = opA.RenewCertificate(ctx, &nstancev1.RenewCertificateRequest{})
	require.NoError(t, err, "a registered operator renews")
	_, err = opB.GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
	require.NoError(t, err)
	standby := startApp(t, store, "srv-b", "s1")
	require.Eventually(t, func() bool { return healthCode(t, standby.app.Addrs().Health) == 200 }, 30*time.Second, 20*time.Millisecond)

	require.NoError(t, store.Delete(ctx, layout.New("").Operator("default", "op-a")))
	_, err = opA.RenewCertificate(ctx, &nstancev1.RenewCertificateRequest{})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	require.ErrorContains(t, refusedHandshake(t, ca, leader.app.Addrs().Operator, certA), "bad certificate", "a new connection at once")
	require.Eventually(t, func() bool {
		_, err := opA.GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
		return status.Code(err) == codes.PermissionDenied
	}, 10*time.Second, 20*time.Millisecond, "the open connection of the deleted operator")
	_, err = opB.RenewCertificate(ctx, &nstancev1.RenewCertificateRequest{})
	require.NoError(t, err)

	// The next leader loaded the entry before serving.
	require.NoError(t, leader.stop())
	waitServing(t, 30*time.Second, standby)
	addr := standby.app.Addrs().Operator
	_, err = operatorClient(t, ca, addr, certA).GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	require.ErrorContains(t, refusedHandshake(t, ca, addr, certA), "bad certificate")
	_, err = operatorClient(t, ca, addr, certB).RenewCertificate(ctx, &nstancev1.RenewCertificateRequest{})
	require.NoError(t, err)
}

// refusedHandshake completes a TLS handshake with cert and reads the
// server's first bytes: in TLS 1.3 a refused client certificate arrives as
// an alert on that read (a gRPC client may instead see its own write fail).
func refusedHandshake(t *testing.T, ca *pki.CA, addr string, cert *tls.Certificate) error {
	t.Helper()
	tc := pki.ClientTLS(ca.Pool(), cert, "127.0.0.1")
	tc.NextProtos = []string{"h2"}
	conn, err := tls.Dial("tcp", addr, tc)
	if err != nil {
		return err
	}
	defer conn.Close()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = conn.Read(make([]byte, 1))
	return err
}
