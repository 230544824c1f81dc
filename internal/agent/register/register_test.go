package register

import (
	"context"
	"crypto"
	"encoding/base64"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/agent/identity"
	"github.com/nstance-dev/nstance/internal/pki"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// scripted is a Registration server over real TLS that answers with the
// given errors first, then issues a certificate for the presented key.
type scripted struct {
	nstancev1.UnimplementedRegistrationServiceServer
	ca *pki.CA

	mu    sync.Mutex
	errs  []error
	calls int
	reqs  []*nstancev1.RegisterAgentRequest
}

func (s *scripted) RegisterAgent(_ context.Context, req *nstancev1.RegisterAgentRequest) (*nstancev1.RegisterAgentResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	s.reqs = append(s.reqs, req)
	if len(s.errs) > 0 {
		err := s.errs[0]
		if len(s.errs) > 1 {
			s.errs = s.errs[1:]
		}
		if err != nil {
			return nil, err
		}
	}
	pub, err := pki.ParseEd25519PublicKeyPEM([]byte(req.GetPublicKeyPem()))
	if err != nil {
		return nil, err
	}
	_, certPEM, err := s.ca.IssueClient(pki.ClientRequest{Identity: pki.Identity{ClusterID: "c1", Tenant: "t", Role: pki.RoleAgent, ClientID: "i-1", Shard: "s1"},
		PublicKey: crypto.PublicKey(pub), Validity: time.Hour}, time.Now())
	if err != nil {
		return nil, err
	}
	return &nstancev1.RegisterAgentResponse{CertificatePem: string(certPEM), CaChainPem: string(s.ca.CertPEM)}, nil
}

func start(t *testing.T, errs ...error) (*scripted, Options) {
	t.Helper()
	ca, err := pki.GenerateCA("c1", time.Hour, time.Now())
	require.NoError(t, err)
	cert, err := ca.ServerKeyPair(pki.ServerIdentity{ClusterID: "c1", Shard: "s1", ServerID: "srv"}, []string{"127.0.0.1"}, time.Hour, time.Now())
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(pki.ServerTLS(cert, nil, false))))
	s := &scripted{ca: ca, errs: errs}
	nstancev1.RegisterRegistrationServiceServer(srv, s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, identity.CAFile), ca.CertPEM, 0o600))
	// The server checks the nonce; the agent only reads its shard claim.
	claims := base64.RawURLEncoding.EncodeToString([]byte(`{"shard":"s1"}`))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "nonce.jwt"), []byte("e30."+claims+".sig"), 0o600))
	id, err := identity.Open(dir)
	require.NoError(t, err)
	return s, Options{Addr: ln.Addr().String(), ServerName: "127.0.0.1", Identity: id, Log: logr.Discard(),
		Backoff: wait.Backoff{Duration: 5 * time.Millisecond, Factor: 2, Cap: 20 * time.Millisecond}}
}

func TestTransientRefusalsAreRetried(t *testing.T) {
	s, o := start(t, status.Error(codes.Unavailable, "registration is unavailable right now; retry later"),
		status.Error(codes.FailedPrecondition, "the nonce is not valid yet"), status.Error(codes.ResourceExhausted, "slow down"), nil)
	require.NoError(t, Ensure(context.Background(), o))
	require.Equal(t, 4, s.calls)
	for _, r := range s.reqs {
		require.Empty(t, r.GetHostname(), "the agent asks for no names")
		require.Empty(t, r.GetIpAddresses())
		require.Equal(t, s.reqs[0].GetPublicKeyPem(), r.GetPublicKeyPem(), "every attempt uses the same key")
	}
	_, err := o.Identity.Certificate(time.Now())
	require.NoError(t, err)
	_, err = o.Identity.Nonce()
	require.ErrorIs(t, err, os.ErrNotExist, "the nonce is removed once registered")
}

func TestDefiniteRefusalsStop(t *testing.T) {
	for _, code := range []codes.Code{codes.Unauthenticated, codes.AlreadyExists, codes.PermissionDenied, codes.InvalidArgument} {
		s, o := start(t, status.Error(code, "registration refused: x"))
		err := Ensure(context.Background(), o)
		require.ErrorIs(t, err, ErrRefused, code.String())
		require.ErrorContains(t, err, "needs a new one")
		require.Equal(t, 1, s.calls, code.String())
	}
}

// A nonce whose shard cannot be read is refused before any call: retrying
// cannot make it usable.
func TestUnreadableNonceIsDefinite(t *testing.T) {
	s, o := start(t)
	require.NoError(t, os.WriteFile(o.Identity.Path("nonce.jwt"), []byte("a.b.c"), 0o600))
	done := make(chan error, 1)
	go func() { done <- Ensure(context.Background(), o) }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, ErrRefused)
		require.ErrorContains(t, err, "nonce")
	case <-time.After(30 * time.Second):
		t.Fatal("an unreadable nonce is retried forever")
	}
	require.Zero(t, s.calls)
}

func TestNotYetValidIsBoundedBySkewAllowance(t *testing.T) {
	s, o := start(t, status.Error(codes.FailedPrecondition, "not valid yet"))
	o.SkewAllowance = 150 * time.Millisecond
	start := time.Now()
	err := Ensure(context.Background(), o)
	require.ErrorIs(t, err, ErrRefused)
	require.ErrorContains(t, err, "clock")
	// Retried (not refused at the first answer) until the allowance passed;
	// how many calls fit in it depends on the machine's load.
	require.GreaterOrEqual(t, s.calls, 2)
	require.GreaterOrEqual(t, time.Since(start), o.SkewAllowance)
}
