package grpcserve_test

import (
	"context"
	"crypto/x509"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/grpcserve"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// An agent presenting an expired certificate fails the handshake, and the
// listener reports it with an error that says the certificate expired; a
// valid one is not reported.
func TestHandshakeErrorsReported(t *testing.T) {
	now := time.Now()
	ca, err := pki.GenerateCA("c1", 24*time.Hour, now.Add(-3*time.Hour))
	require.NoError(t, err)
	srvCert, err := ca.ServerKeyPair(pki.ServerIdentity{Shard: "s1", ServerID: "srv"}, []string{"127.0.0.1"}, time.Hour, now)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var got []error
	var names []string
	srv, err := grpcserve.Start(grpcserve.Config{ClusterID: "c1", ServerCert: srvCert, ClientCAs: ca.Pool(),
		Agent: &nstancev1.UnimplementedAgentServiceServer{},
		OnHandshakeError: func(name string, err error) {
			mu.Lock()
			got, names = append(got, err), append(names, name)
			mu.Unlock()
		}}, grpcserve.Listeners{Agent: ln})
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	valid := nstancev1.NewAgentServiceClient(dial(t, ln.Addr().String(), ca, clientCert(t, ca, pki.RoleAgent, now)))
	_, err = valid.SubmitPublicKeys(ctx, &nstancev1.SubmitPublicKeysRequest{})
	require.Error(t, err) // Unimplemented, after a good handshake
	mu.Lock()
	require.Empty(t, got)
	mu.Unlock()

	expired := nstancev1.NewAgentServiceClient(dial(t, ln.Addr().String(), ca, clientCert(t, ca, pki.RoleAgent, now.Add(-2*time.Hour))))
	_, err = expired.SubmitPublicKeys(ctx, &nstancev1.SubmitPublicKeysRequest{})
	require.Error(t, err)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) > 0 }, 5*time.Second, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	var inv x509.CertificateInvalidError
	require.True(t, errors.As(got[0], &inv), "%v", got[0])
	require.Equal(t, x509.Expired, inv.Reason)
	require.Equal(t, "agent", names[0])
}
