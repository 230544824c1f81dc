package agentapi_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/agentapi"
	"github.com/nstance-dev/nstance/internal/server/authz"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
	"github.com/nstance-dev/nstance/test/agent/agenttest"
)

// presenting is the context of an agent call over mTLS with leaf.
func presenting(leaf *x509.Certificate) context.Context {
	ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{
		State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{leaf}}}}})
	id, err := pki.IdentityFromCert(leaf, agenttest.ClusterID)
	if err != nil {
		panic(err)
	}
	return authz.WithIdentity(ctx, id)
}

func agentLeaf(t *testing.T, ca *pki.CA, issuedAt time.Time, validity time.Duration) *x509.Certificate {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	id := pki.Identity{ClusterID: agenttest.ClusterID, Tenant: agenttest.Tenant, Role: pki.RoleAgent, ClientID: "i-1", Shard: agenttest.ShardID, Group: "g"}
	c, _, err := ca.IssueClient(pki.ClientRequest{Identity: id, PublicKey: pub, DNSNames: []string{"node-1"}, Validity: validity}, issuedAt)
	require.NoError(t, err)
	return c
}

func identityKey(t *testing.T) (string, ed25519.PublicKey) {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	return pubPEM(t, pub), pub
}

func submitIdentity(t *testing.T, s *agenttest.Shard, ctx context.Context, pem string) *nstancev1.SubmitPublicKeysResponse {
	t.Helper()
	resp, err := s.Agent.SubmitPublicKeys(ctx, &nstancev1.SubmitPublicKeysRequest{Keys: []*nstancev1.PublicKey{
		{Name: pki.AgentIdentityKeyName, Type: nstancev1.KeyType_KEY_TYPE_ED25519, PublicKeyPem: pem}}})
	require.NoError(t, err)
	return resp
}

func identityFiles(t *testing.T, s *agenttest.Shard, ctx context.Context) []*nstancev1.DeliveredFile {
	t.Helper()
	d, err := s.Agent.Delivery(ctx, agentapi.Ref{InstanceID: "i-1", Tenant: agenttest.Tenant, Shard: agenttest.ShardID, Group: "g"})
	require.NoError(t, err)
	var out []*nstancev1.DeliveredFile
	for _, f := range d.GetFiles() {
		if f.GetKind() == nstancev1.FileKind_FILE_KIND_AGENT_IDENTITY {
			out = append(out, f)
		}
	}
	return out
}

func TestIdentityRenewal(t *testing.T) {
	s := newShard(t, config.Template{Files: map[string]config.TemplateFile{"motd": {Kind: "string", Content: "hi"}}})

	// A certificate a third into its life is not renewed.
	fresh := agentLeaf(t, s.CA, time.Now().Add(-20*time.Minute), time.Hour)
	keyPEM, _ := identityKey(t)
	resp := submitIdentity(t, s, presenting(fresh), keyPEM)
	require.Empty(t, resp.GetAccepted())
	require.Len(t, resp.GetRejected(), 1)
	require.Contains(t, resp.GetRejected()[0].GetReason(), "not due")
	require.Empty(t, identityFiles(t, s, presenting(fresh)))

	// Past two thirds it is; the new certificate has the same identity and
	// names, the submitted key, the cluster CA, and a fresh lifetime.
	old := agentLeaf(t, s.CA, time.Now().Add(-41*time.Minute), time.Hour)
	ctx := presenting(old)
	wrongType, err := s.Agent.SubmitPublicKeys(ctx, &nstancev1.SubmitPublicKeysRequest{Keys: []*nstancev1.PublicKey{
		{Name: pki.AgentIdentityKeyName, Type: nstancev1.KeyType_KEY_TYPE_ECDSA_P256, PublicKeyPem: keyPEM}}})
	require.NoError(t, err)
	require.Len(t, wrongType.GetRejected(), 1)
	resp = submitIdentity(t, s, ctx, keyPEM)
	require.Equal(t, []string{pki.AgentIdentityKeyName}, resp.GetAccepted())
	files := identityFiles(t, s, ctx)
	require.Len(t, files, 1)
	renewed, err := pki.ParseCertificatePEM(files[0].GetContent())
	require.NoError(t, err)
	_, err = renewed.Verify(x509.VerifyOptions{Roots: s.CA.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	require.NoError(t, err)
	want, _ := pki.IdentityFromCert(old, agenttest.ClusterID)
	got, err := pki.IdentityFromCert(renewed, agenttest.ClusterID)
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.Equal(t, old.DNSNames, renewed.DNSNames)
	_, pub := identityKey(t)
	require.False(t, pub.Equal(renewed.PublicKey))
	wantPub, _ := pki.ParseEd25519PublicKeyPEM([]byte(keyPEM))
	require.True(t, wantPub.Equal(renewed.PublicKey))
	require.True(t, renewed.NotAfter.After(old.NotAfter))
	require.Contains(t, string(files[0].GetContent()), string(s.CA.CertPEM), "the CA chain follows the certificate")

	// The same key again (a retried submission) is fine.
	require.Equal(t, []string{pki.AgentIdentityKeyName}, submitIdentity(t, s, ctx, keyPEM).GetAccepted())

	// Once the agent presents the renewed certificate the delivery is stable,
	// and its renewal is not due.
	rctx := presenting(renewed)
	require.Len(t, identityFiles(t, s, rctx), 1)
	other, _ := identityKey(t)
	require.Contains(t, submitIdentity(t, s, rctx, other).GetRejected()[0].GetReason(), "not due")
	require.Zero(t, s.Revoked.Load())
}

// fakeClock is agentapi's clock in tests that step through a grace.
type fakeClock struct{ t atomic.Pointer[time.Time] }

func newFakeClock(t time.Time) *fakeClock { c := &fakeClock{}; c.set(t); return c }
func (c *fakeClock) now() time.Time       { return *c.t.Load() }
func (c *fakeClock) set(t time.Time)      { c.t.Store(&t) }

// graceShard is newShard with another TwoHolderGrace and agentapi's clock
// read from clk.
func graceShard(t *testing.T, grace time.Duration, clk *fakeClock) *agenttest.Shard {
	t.Helper()
	s, err := agenttest.New(logr.Discard())
	require.NoError(t, err)
	s.TwoHolderGrace = grace
	s.Now = clk.now
	require.NoError(t, s.Start())
	t.Cleanup(s.Stop)
	_, err = s.Add(agenttest.Instance{ID: "i-1", Group: "g"}, t.TempDir())
	require.NoError(t, err)
	return s
}

// TestTwoHoldersOfOneIdentity: a copy of an agent certificate and key
// renewed by one holder must not leave the other locked out while the
// first keeps the identity. A renewal from the superseded certificate for
// another key, or a call with it once the renewed one is in use, revokes
// the instance's agent certificates and tells the tenant (finding "thief
// renews first" of the trust review). agentapi's clock is stepped; the
// renewed certificate is issued at real time.
func TestTwoHoldersOfOneIdentity(t *testing.T) {
	const grace = 30 * time.Second
	t.Run("both renew", func(t *testing.T) {
		// The grace is counted from the renewed certificate's issuance,
		// which certificates record to the second.
		clk := newFakeClock(time.Now())
		s := graceShard(t, grace, clk)
		due := agentLeaf(t, s.CA, time.Now().Add(-41*time.Minute), time.Hour)
		first, _ := identityKey(t)
		require.Equal(t, []string{pki.AgentIdentityKeyName}, submitIdentity(t, s, presenting(due), first).GetAccepted())
		renewedAt := time.Now()
		second, _ := identityKey(t)
		clk.set(renewedAt.Add(grace / 2))
		resp := submitIdentity(t, s, presenting(due), second)
		require.Len(t, resp.GetRejected(), 1)
		require.Contains(t, resp.GetRejected()[0].GetReason(), "just renewed", "the agent's old connection after its own renewal")
		require.Zero(t, s.Revoked.Load())
		clk.set(renewedAt.Add(grace + 2*time.Second))
		resp = submitIdentity(t, s, presenting(due), second)
		require.Len(t, resp.GetRejected(), 1)
		require.Contains(t, resp.GetRejected()[0].GetReason(), "held twice")
		require.Equal(t, int64(1), s.Revoked.Load())
		require.Equal(t, int64(1), s.Refused.Load(), "the tenant is told")
	})
	t.Run("superseded certificate after the renewed one", func(t *testing.T) {
		clk := newFakeClock(time.Now())
		s := graceShard(t, grace, clk)
		due := agentLeaf(t, s.CA, time.Now().Add(-41*time.Minute), time.Hour)
		key, _ := identityKey(t)
		require.Equal(t, []string{pki.AgentIdentityKeyName}, submitIdentity(t, s, presenting(due), key).GetAccepted())
		files := identityFiles(t, s, presenting(due))
		require.Len(t, files, 1, "the holder of the old certificate may fetch the renewed one")
		renewed, err := pki.ParseCertificatePEM(files[0].GetContent())
		require.NoError(t, err)
		_, err = s.Agent.SubmitPublicKeys(presenting(due), &nstancev1.SubmitPublicKeysRequest{})
		require.NoError(t, err, "until the renewed certificate is in use")
		used := clk.now()
		_, err = s.Agent.SubmitPublicKeys(presenting(renewed), &nstancev1.SubmitPublicKeysRequest{})
		require.NoError(t, err)
		clk.set(used.Add(grace))
		_, err = s.Agent.SubmitPublicKeys(presenting(due), &nstancev1.SubmitPublicKeysRequest{})
		require.NoError(t, err, "the old connection's last calls, within the grace")
		require.Zero(t, s.Revoked.Load(), "an ordinary renewal")
		clk.set(used.Add(grace + time.Millisecond))
		_, err = s.Agent.SubmitPublicKeys(presenting(due), &nstancev1.SubmitPublicKeysRequest{})
		require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
		require.Contains(t, err.Error(), "held twice")
		require.Equal(t, int64(1), s.Revoked.Load())
	})
}

func TestRenewAtIgnoresBackdating(t *testing.T) {
	ca, err := pki.GenerateCA(agenttest.ClusterID, time.Hour, time.Now())
	require.NoError(t, err)
	at := time.Now().Truncate(time.Second)
	c := agentLeaf(t, ca, at, 30*time.Second)
	require.True(t, at.Add(20*time.Second).Equal(pki.RenewAt(c, 2.0/3)), "renew at %s", pki.RenewAt(c, 2.0/3))
	require.Equal(t, 30*time.Second, pki.Lifetime(c))
}
