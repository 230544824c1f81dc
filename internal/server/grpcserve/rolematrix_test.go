package grpcserve_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/authz"
	"github.com/nstance-dev/nstance/internal/server/grpcserve"
	"github.com/nstance-dev/nstance/internal/server/operatorsvc"
	"github.com/nstance-dev/nstance/internal/server/registration"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// echoAgent answers SubmitPublicKeys with the caller identity it sees.
type echoAgent struct {
	nstancev1.UnimplementedAgentServiceServer
}

func (echoAgent) SubmitPublicKeys(ctx context.Context, _ *nstancev1.SubmitPublicKeysRequest) (*nstancev1.SubmitPublicKeysResponse, error) {
	id, ok := authz.IdentityFrom(ctx)
	if !ok {
		return nil, status.Error(codes.Internal, "no identity in context")
	}
	return &nstancev1.SubmitPublicKeysResponse{Accepted: []string{id.ClientID, id.Tenant, string(id.Role)}}, nil
}

type fixture struct {
	ca       *pki.CA
	nonceKey ed25519.PrivateKey
	addrs    map[string]string
}

func startServer(t *testing.T) *fixture {
	t.Helper()
	now := time.Now()
	ca, err := pki.GenerateCA("c1", 24*time.Hour, now)
	require.NoError(t, err)
	srvCert, err := ca.ServerKeyPair(pki.ServerIdentity{Shard: "s1", ServerID: "nstance-server"}, []string{"127.0.0.1"}, time.Hour, now)
	require.NoError(t, err)
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	store := memstore.New()
	issuer := &registration.Issuer{CA: ca, ClusterID: "c1", AgentValidity: time.Hour, OperatorValidity: time.Hour}
	reg := registration.New(registration.Options{ClusterID: "c1", Shard: "s1", ServerID: "srv", Issuer: issuer, NonceKey: pub,
		Store: store, Keys: layout.New(""), Log: logr.Discard()})
	ls := grpcserve.Listeners{}
	addrs := map[string]string{}
	for name, ln := range map[string]*net.Listener{"registration": &ls.Registration, "operator": &ls.Operator, "agent": &ls.Agent} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		*ln = l
		addrs[name] = l.Addr().String()
	}
	srv, err := grpcserve.Start(grpcserve.Config{
		ClusterID: "c1", ServerCert: srvCert, ClientCAs: ca.Pool(),
		Registration: reg, Operator: operatorsvc.New(operatorsvc.Options{Shard: "s1", Issuer: issuer}), Agent: echoAgent{},
	}, ls)
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	return &fixture{ca: ca, nonceKey: priv, addrs: addrs}
}

func clientCert(t *testing.T, ca *pki.CA, role pki.Role, issuedAt time.Time) *tls.Certificate {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	id := pki.Identity{ClusterID: "c1", Tenant: "default", Role: role, ClientID: string(role) + "-1"}
	if role == pki.RoleAgent {
		id.Shard = "s1"
	}
	cert, _, err := ca.IssueClient(pki.ClientRequest{Identity: id, PublicKey: pub, Validity: time.Hour}, issuedAt)
	require.NoError(t, err)
	return &tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: priv}
}

func dial(t *testing.T, addr string, roots *pki.CA, cert *tls.Certificate) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientTLS(roots.Pool(), cert, "127.0.0.1"))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func TestRoleMatrix(t *testing.T) {
	f := startServer(t)
	foreign, err := pki.GenerateCA("c1", time.Hour, time.Now())
	require.NoError(t, err)
	pubPEM := func() string {
		pub, _, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		p, err := pki.MarshalPublicKeyPEM(pub)
		require.NoError(t, err)
		return string(p)
	}

	// certFor builds the client certificate of a case; for the foreign-CA and
	// expired cases it carries the role the service under test would accept.
	certFor := map[string]func(service pki.Role) *tls.Certificate{
		"no client cert": func(pki.Role) *tls.Certificate { return nil },
		"agent cert":     func(pki.Role) *tls.Certificate { return clientCert(t, f.ca, pki.RoleAgent, time.Now()) },
		"operator cert":  func(pki.Role) *tls.Certificate { return clientCert(t, f.ca, pki.RoleOperator, time.Now()) },
		"foreign CA cert": func(r pki.Role) *tls.Certificate {
			return clientCert(t, foreign, r, time.Now())
		},
		"expired cert": func(r pki.Role) *tls.Certificate {
			return clientCert(t, f.ca, r, time.Now().Add(-3*time.Hour))
		},
	}
	allowed := map[string]map[string]bool{
		"registration": {"no client cert": true, "agent cert": true, "operator cert": true, "foreign CA cert": true, "expired cert": true},
		"operator":     {"operator cert": true},
		"agent":        {"agent cert": true},
	}
	calls := map[string]func(ctx context.Context, conn *grpc.ClientConn) error{
		"registration": func(ctx context.Context, conn *grpc.ClientConn) error {
			tok, err := nonce.Mint(f.nonceKey, nonce.Claims{Kind: nonce.KindOperator, ClusterID: "c1", Tenant: "default", RegisteredClaims: jwt.RegisteredClaims{Subject: "op"}}, time.Hour, time.Now())
			require.NoError(t, err)
			resp, err := nstancev1.NewRegistrationServiceClient(conn).RegisterOperator(ctx, &nstancev1.RegisterOperatorRequest{Nonce: tok, PublicKeyPem: pubPEM()})
			if err == nil {
				require.Equal(t, nstancev1.ClientRole_CLIENT_ROLE_OPERATOR, resp.GetIdentity().GetRole())
			}
			return err
		},
		"operator": func(ctx context.Context, conn *grpc.ClientConn) error {
			resp, err := nstancev1.NewOperatorServiceClient(conn).GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
			if err == nil {
				require.Equal(t, "s1", resp.GetShard())
			}
			return err
		},
		"agent": func(ctx context.Context, conn *grpc.ClientConn) error {
			resp, err := nstancev1.NewAgentServiceClient(conn).SubmitPublicKeys(ctx, &nstancev1.SubmitPublicKeysRequest{})
			if err == nil {
				require.Equal(t, []string{"agent-1", "default", "agent"}, resp.GetAccepted())
			}
			return err
		},
	}
	roleOf := map[string]pki.Role{"registration": pki.RoleOperator, "operator": pki.RoleOperator, "agent": pki.RoleAgent}
	n := 0
	for _, service := range []string{"registration", "operator", "agent"} {
		for _, certCase := range []string{"no client cert", "agent cert", "operator cert", "foreign CA cert", "expired cert"} {
			n++
			t.Run(service+"/"+certCase, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				conn := dial(t, f.addrs[service], f.ca, certFor[certCase](roleOf[service]))
				err := calls[service](ctx, conn)
				if allowed[service][certCase] {
					require.NoError(t, err)
					return
				}
				require.Error(t, err)
				code := status.Code(err)
				// A certificate that fails verification is refused in the TLS
				// handshake (Unavailable); a valid one with the wrong role is
				// refused by the interceptor (PermissionDenied).
				require.Contains(t, []codes.Code{codes.Unavailable, codes.PermissionDenied, codes.Unauthenticated}, code, "error: %v", err)
				if certCase == "agent cert" || certCase == "operator cert" {
					require.Equal(t, codes.PermissionDenied, code, "error: %v", err)
				}
			})
		}
	}
	require.Equal(t, 15, n)
}

func TestRenewCertificate(t *testing.T) {
	f := startServer(t)
	cert := clientCert(t, f.ca, pki.RoleOperator, time.Now())
	conn := dial(t, f.addrs["operator"], f.ca, cert)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := nstancev1.NewOperatorServiceClient(conn).RenewCertificate(ctx, &nstancev1.RenewCertificateRequest{})
	require.NoError(t, err)
	renewed, err := pki.ParseCertificatePEM([]byte(resp.GetCertificatePem()))
	require.NoError(t, err)
	id, err := pki.IdentityFromCert(renewed, "c1")
	require.NoError(t, err)
	require.Equal(t, "operator-1", id.ClientID)
	require.Equal(t, pki.RoleOperator, id.Role)
	require.True(t, renewed.PublicKey.(ed25519.PublicKey).Equal(cert.PrivateKey.(ed25519.PrivateKey).Public()))

	_, err = nstancev1.NewOperatorServiceClient(conn).RenewCertificate(ctx, &nstancev1.RenewCertificateRequest{PublicKeyPem: "junk"})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
}
