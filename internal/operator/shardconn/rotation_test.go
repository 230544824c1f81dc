package shardconn

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/grpcserve"
	"github.com/nstance-dev/nstance/internal/server/operatorsvc"
	"github.com/nstance-dev/nstance/internal/server/registration"
)

// rotatingServer is an Operator listener whose signing CA and trusted
// bundle follow a pki.Trust, as nstance-server's do during a CA rotation.
type rotatingServer struct {
	t     *testing.T
	trust *pki.Trust
	cert  *pki.RenewingCert
	addr  string
	srv   *grpcserve.Servers
}

func (s *rotatingServer) start() {
	t := s.t
	ln, err := net.Listen("tcp", s.addr)
	require.NoError(t, err)
	s.addr = ln.Addr().String()
	issuer := &registration.Issuer{Trust: s.trust, ClusterID: clusterID, AgentValidity: time.Hour, OperatorValidity: time.Hour}
	s.srv, err = grpcserve.Start(grpcserve.Config{
		ClusterID: clusterID, GetCertificate: s.cert.GetCertificate, ClientCAsFunc: s.trust.Pool,
		Operator: operatorsvc.New(operatorsvc.Options{Shard: "a", Issuer: issuer}),
	}, grpcserve.Listeners{Operator: ln})
	require.NoError(t, err)
}

// restart drops every connection, so clients handshake again.
func (s *rotatingServer) restart() {
	s.srv.Stop()
	require.Eventually(s.t, func() bool {
		ln, err := net.Listen("tcp", s.addr)
		if err == nil {
			ln.Close()
		}
		return err == nil
	}, 5*time.Second, 20*time.Millisecond)
	s.start()
}

// The operator takes the bundle from RenewCertificate and verifies servers
// against it at each new handshake: it reconnects to a server that switched
// to the new CA, gets a certificate of the new CA, and drops the old CA
// once it is retired. An operator that never renewed cannot reconnect.
func TestRenewalFollowsCARotation(t *testing.T) {
	now := time.Now()
	oldCA, err := pki.GenerateCA(clusterID, 24*time.Hour, now)
	require.NoError(t, err)
	newCA, err := pki.GenerateCA(clusterID, 24*time.Hour, now)
	require.NoError(t, err)
	trust, err := pki.NewTrust(oldCA, nil)
	require.NoError(t, err)
	cert, err := pki.NewRenewingCert(func(now time.Time) (tls.Certificate, error) {
		return trust.Signer().ServerKeyPair(pki.ServerIdentity{Shard: "a", ServerID: "s"}, []string{"127.0.0.1"}, time.Hour, now)
	}, 2.0/3, nil, logr.Discard())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go cert.Run(ctx)
	s := &rotatingServer{t: t, trust: trust, cert: cert, addr: "127.0.0.1:0"}
	s.start()
	t.Cleanup(func() { s.srv.Stop() })

	storedCA := make(chan []byte, 8)
	newManager := func(store bool) *Manager {
		o := Options{Shards: map[string]string{"a": s.addr}, ClusterID: clusterID, Log: logr.Discard(), MaxBackoff: 200 * time.Millisecond}
		if store {
			o.StoreCert = func(_ context.Context, _, _, caPEM []byte) error { storedCA <- caPEM; return nil }
		}
		m := New(o)
		require.NoError(t, m.Start(ctx, operatorCreds(t, oldCA, time.Hour)))
		require.Eventually(t, func() bool { return m.Healthy("a") }, 10*time.Second, 20*time.Millisecond)
		return m
	}
	m, laggard := newManager(true), newManager(false)
	caCount := func() int {
		certs, err := pki.ParseCertificatesPEM(m.Certificate().CAPEM)
		require.NoError(t, err)
		return len(certs)
	}

	// introduce
	_, err = trust.Update(oldCA, pki.EncodeBundle(oldCA.Cert, newCA.Cert))
	require.NoError(t, err)
	require.NoError(t, m.Renew(ctx))
	require.Equal(t, 2, caCount())
	certs, err := pki.ParseCertificatesPEM(<-storedCA)
	require.NoError(t, err)
	require.Len(t, certs, 2, "the bundle is stored with the certificate")

	// switch
	_, err = trust.Update(newCA, pki.EncodeBundle(oldCA.Cert, newCA.Cert))
	require.NoError(t, err)
	cert.RenewNow()
	require.Eventually(t, func() bool { return cert.Current().Leaf.CheckSignatureFrom(newCA.Cert) == nil }, 5*time.Second, 10*time.Millisecond)
	s.restart()
	// Renewal retries as the renewal loop does: the first call may still
	// meet the connection the restart closed.
	require.Eventually(t, func() bool { return m.Renew(ctx) == nil }, 10*time.Second, 20*time.Millisecond, "reconnects to the switched server")
	require.NoError(t, m.Certificate().Leaf.CheckSignatureFrom(newCA.Cert))
	<-storedCA
	// Control: the operator that never renewed cannot verify the server.
	require.Eventually(t, func() bool { return !laggard.Healthy("a") }, 10*time.Second, 20*time.Millisecond)
	time.Sleep(500 * time.Millisecond)
	require.False(t, laggard.Healthy("a"))

	// retire
	_, err = trust.Update(newCA, pki.EncodeBundle(newCA.Cert))
	require.NoError(t, err)
	require.NoError(t, m.Renew(ctx))
	require.Equal(t, 1, caCount())
	s.restart()
	require.Eventually(t, func() bool { return m.Renew(ctx) == nil }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, 1, caCount())
}
