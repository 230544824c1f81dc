package shardtest_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// agentClient dials the Operator service with an agent-role certificate.
func agentClient(t *testing.T, sh *shardtest.Shard) nstancev1.OperatorServiceClient {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	cert, _, err := sh.CA.IssueClient(pki.ClientRequest{
		Identity:  pki.Identity{ClusterID: sh.ClusterID, Tenant: "default", Role: pki.RoleAgent, ClientID: "i-1", Shard: sh.ShardID},
		PublicKey: pub, Validity: time.Hour,
	}, time.Now())
	require.NoError(t, err)
	tc := tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: priv, Leaf: cert}
	conn, err := grpc.NewClient(sh.OperatorAddr, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientTLS(sh.CA.Pool(), &tc, "127.0.0.1"))))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return nstancev1.NewOperatorServiceClient(conn)
}
