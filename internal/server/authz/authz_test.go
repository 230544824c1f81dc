package authz

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/pki"
)

func peerCtx(info credentials.AuthInfo) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}, AuthInfo: info})
}

func TestAuthenticate(t *testing.T) {
	ca, err := pki.GenerateCA("c1", time.Hour, time.Now())
	require.NoError(t, err)
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	other, err := pki.GenerateCA("c2", time.Hour, time.Now())
	require.NoError(t, err)
	issue := func(cluster string, role pki.Role) *x509.Certificate {
		ca := ca
		if cluster == "c2" {
			ca = other
		}
		c, _, err := ca.IssueClient(pki.ClientRequest{Identity: pki.Identity{ClusterID: cluster, Tenant: "t", Role: role, ClientID: "x"}, PublicKey: pub, Validity: time.Hour}, time.Now())
		require.NoError(t, err)
		return c
	}
	verified := func(c *x509.Certificate) credentials.AuthInfo {
		return credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{c, ca.Cert}}}}
	}
	p := Policy{Roles: []pki.Role{pki.RoleOperator, pki.RoleAdmin}, ClusterID: "c1"}
	tests := []struct {
		name string
		ctx  context.Context
		code codes.Code
	}{
		{"no peer", context.Background(), codes.Unauthenticated},
		{"not TLS", peerCtx(plainAuth{}), codes.Unauthenticated},
		{"TLS without client cert", peerCtx(credentials.TLSInfo{}), codes.Unauthenticated},
		{"wrong role", peerCtx(verified(issue("c1", pki.RoleAgent))), codes.PermissionDenied},
		{"wrong cluster", peerCtx(verified(issue("c2", pki.RoleOperator))), codes.PermissionDenied},
		{"allowed", peerCtx(verified(issue("c1", pki.RoleOperator))), codes.OK},
		{"admin allowed", peerCtx(verified(issue("c1", pki.RoleAdmin))), codes.OK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var seen *pki.Identity
			_, err := p.Unary()(tc.ctx, nil, &grpc.UnaryServerInfo{}, func(ctx context.Context, _ any) (any, error) {
				id, ok := IdentityFrom(ctx)
				require.True(t, ok)
				seen = &id
				return nil, nil
			})
			require.Equal(t, tc.code, status.Code(err), "%v", err)
			if tc.code == codes.OK {
				require.Equal(t, "x", seen.ClientID)
				require.Contains(t, p.Roles, seen.Role)
			} else {
				require.Nil(t, seen, "handler must not run")
			}
		})
	}
}

type plainAuth struct{}

func (plainAuth) AuthType() string { return "insecure" }

func TestRequireRole(t *testing.T) {
	_, err := RequireRole(context.Background(), pki.RoleAdmin)
	require.Equal(t, codes.Unauthenticated, status.Code(err))
	op := WithIdentity(context.Background(), pki.Identity{Role: pki.RoleOperator, Tenant: "t"})
	_, err = RequireRole(op, pki.RoleAdmin)
	require.Equal(t, codes.PermissionDenied, status.Code(err))
	adm := WithIdentity(context.Background(), pki.Identity{Role: pki.RoleAdmin, Tenant: "t"})
	id, err := RequireRole(adm, pki.RoleAdmin)
	require.NoError(t, err)
	require.Equal(t, "t", id.Tenant)
}
