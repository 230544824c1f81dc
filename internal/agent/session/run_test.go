package session

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"math"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/pki"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// renewingServer is an Agent service on loopback mTLS. On the first
// ReceiveFiles stream it delivers renewed, the agent's new identity
// certificate; it records the client certificate of every ReceiveFiles
// stream, and otherwise holds its streams open.
type renewingServer struct {
	nstancev1.UnimplementedAgentServiceServer
	renewed []byte

	mu      sync.Mutex
	clients []*x509.Certificate
}

func (s *renewingServer) seen() []*x509.Certificate {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*x509.Certificate(nil), s.clients...)
}

func (s *renewingServer) ReceiveFiles(_ *nstancev1.ReceiveFilesRequest, stream grpc.ServerStreamingServer[nstancev1.FileDelivery]) error {
	p, ok := peer.FromContext(stream.Context())
	if !ok {
		return errors.New("no peer")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return errors.New("no client certificate")
	}
	s.mu.Lock()
	s.clients = append(s.clients, info.State.PeerCertificates[0])
	first := len(s.clients) == 1
	s.mu.Unlock()
	if first {
		err := stream.Send(&nstancev1.FileDelivery{ConfigHash: "h-renewed", Files: []*nstancev1.DeliveredFile{
			{Path: "identity.pem", Content: s.renewed, Kind: nstancev1.FileKind_FILE_KIND_AGENT_IDENTITY},
		}})
		if err != nil {
			return err
		}
	}
	<-stream.Context().Done()
	return nil
}

func (s *renewingServer) KeyGenRequests(_ *nstancev1.KeyGenRequestsRequest, stream grpc.ServerStreamingServer[nstancev1.KeyGenRequest]) error {
	<-stream.Context().Done()
	return nil
}

func (s *renewingServer) ReportHealth(stream grpc.ClientStreamingServer[nstancev1.HealthReport, nstancev1.ReportHealthResponse]) error {
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return stream.SendAndClose(&nstancev1.ReportHealthResponse{})
			}
			return err
		}
	}
}

func TestRunReconnectsAtOnceWithRenewedIdentity(t *testing.T) {
	// A renewed identity ends the connection on purpose: Run reconnects at
	// once with the new certificate, without counting a lost connection or
	// waiting for the backoff (an hour here).
	f := newFixture(t)
	now := time.Now()
	pubPEM, err := f.id.PendingPublicKeyPEM()
	require.NoError(t, err)
	pub, err := pki.ParseEd25519PublicKeyPEM([]byte(pubPEM))
	require.NoError(t, err)
	renewedCert, renewedPEM, err := f.ca.IssueClient(pki.ClientRequest{Identity: agentID(), PublicKey: pub, Validity: 2 * time.Hour}, now)
	require.NoError(t, err)

	srvCert, err := f.ca.ServerKeyPair(pki.ServerIdentity{Shard: "s1", ServerID: "srv"}, []string{"127.0.0.1"}, time.Hour, now)
	require.NoError(t, err)
	srv := &renewingServer{renewed: renewedPEM}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(pki.ServerTLS(srvCert, f.ca.Pool(), true))))
	nstancev1.RegisterAgentServiceServer(gs, srv)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = gs.Serve(l) }()
	t.Cleanup(gs.Stop)

	o := f.s.o
	o.Addr = l.Addr().String()
	o.Backoff = wait.Backoff{Duration: time.Hour, Factor: 2, Jitter: 1, Steps: math.MaxInt32, Cap: time.Hour}
	s, err := New(o)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not stop with its context")
		}
	}()

	// Either the second connection arrives or the first counts as lost
	// (and Run sits in its hour-long backoff).
	require.Eventually(t, func() bool { return len(srv.seen()) >= 2 || s.Lost() > 0 }, 30*time.Second, 5*time.Millisecond)
	require.Equal(t, 0, s.Lost(), "a renewal is not a lost connection")
	seen := srv.seen()
	require.GreaterOrEqual(t, len(seen), 2, "Run reconnected without waiting for the backoff")
	require.NotEqual(t, renewedCert.Raw, seen[0].Raw)
	require.Equal(t, renewedCert.Raw, seen[1].Raw, "the next connection presents the renewed certificate")
	require.Equal(t, 1, s.Renewals())
	require.Equal(t, "h-renewed", s.ConfigHash())
}
