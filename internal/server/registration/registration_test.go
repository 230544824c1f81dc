package registration

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

type fixture struct {
	svc      *Service
	nonceKey ed25519.PrivateKey
	store    *memstore.Store
	records  *instances.Store
	policy   SourcePolicy
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ca, err := pki.GenerateCA("c1", 24*time.Hour, time.Now())
	require.NoError(t, err)
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	store := memstore.New()
	f := &fixture{nonceKey: priv, store: store, records: instances.NewStore(store, layout.New(""), "s1", nil)}
	f.addRecord(t, &instances.Record{ID: "i-1", Tenant: "acme", GroupID: "web", Shard: "s1", State: instances.StateRunning})
	f.svc = &Service{
		Instances: &InstanceGate{Records: f.records, Policy: func() SourcePolicy { return f.policy }},
		Issuer:    &Issuer{CA: ca, ClusterID: "c1", AgentValidity: time.Hour, OperatorValidity: 2 * time.Hour},
		Verifier:  &nonce.Verifier{Key: pub, ClusterID: "c1", Shard: "s1"},
		Ledger:    &nonce.Ledger{Store: store, Keys: layout.New("")},
		Objects:   store, Keys: layout.New(""), ServerID: "srv", Log: logr.Discard(),
	}
	return f
}

func (f *fixture) addRecord(t *testing.T, rec *instances.Record) {
	t.Helper()
	rec.CreatedAt = time.Now().UTC()
	require.NoError(t, f.records.Create(context.Background(), rec))
}

func (f *fixture) agentNonce(t *testing.T) string {
	t.Helper()
	return f.agentNonceFor(t, "i-1", "web")
}

func (f *fixture) agentNonceFor(t *testing.T, id, group string) string {
	t.Helper()
	tok, err := nonce.Mint(f.nonceKey, nonce.Claims{Kind: nonce.KindAgent, ClusterID: "c1", Tenant: "acme", Shard: "s1", Group: group,
		RegisteredClaims: jwt.RegisteredClaims{Subject: id}}, time.Minute, time.Now())
	require.NoError(t, err)
	return tok
}

// from returns a context whose gRPC peer is ip.
func from(ip string) context.Context {
	return peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}})
}

func pubPEM(t *testing.T) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	p, err := pki.MarshalPublicKeyPEM(pub)
	require.NoError(t, err)
	return string(p)
}

func TestBadFieldsDoNotSpendTheNonce(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	tok := f.agentNonce(t)
	ca, err := pki.GenerateCA("x", time.Hour, time.Now())
	require.NoError(t, err)
	bad := []struct {
		name string
		req  *nstancev1.RegisterAgentRequest
		want string
	}{
		{"no nonce", &nstancev1.RegisterAgentRequest{PublicKeyPem: pubPEM(t)}, "nonce: required"},
		{"no key", &nstancev1.RegisterAgentRequest{Nonce: tok}, "public_key_pem"},
		{"certificate instead of key", &nstancev1.RegisterAgentRequest{Nonce: tok, PublicKeyPem: string(ca.CertPEM)}, "public_key_pem"},
		{"bad ip", &nstancev1.RegisterAgentRequest{Nonce: tok, PublicKeyPem: pubPEM(t), IpAddresses: []string{"10.0.0.300"}}, "ip_addresses[0]"},
		{"bad hostname", &nstancev1.RegisterAgentRequest{Nonce: tok, PublicKeyPem: pubPEM(t), Hostname: "a b"}, "hostname"},
	}
	for _, tc := range bad {
		_, err := f.svc.RegisterAgent(ctx, tc.req)
		require.Equal(t, codes.InvalidArgument, status.Code(err), tc.name)
		require.Contains(t, err.Error(), tc.want, tc.name)
	}
	objs, err := f.store.List(ctx, "shard/s1/nonces/")
	require.NoError(t, err)
	require.Empty(t, objs, "refused requests must not mark the nonce used")

	_, err = f.records.Update(ctx, "i-1", func(r *instances.Record) error { r.Addresses = []string{"10.0.0.7"}; return nil })
	require.NoError(t, err)
	resp, err := f.svc.RegisterAgent(from("10.0.0.7"), &nstancev1.RegisterAgentRequest{Nonce: tok, PublicKeyPem: pubPEM(t), IpAddresses: []string{"10.0.0.7"}, Hostname: "i-1"})
	require.NoError(t, err)
	cert, err := pki.ParseCertificatePEM([]byte(resp.GetCertificatePem()))
	require.NoError(t, err)
	id, err := pki.IdentityFromCert(cert, "c1")
	require.NoError(t, err)
	require.Equal(t, pki.Identity{ClusterID: "c1", Tenant: "acme", Role: pki.RoleAgent, ClientID: "i-1", Shard: "s1", Group: "web"}, id)
	require.Len(t, cert.IPAddresses, 1)
	require.Equal(t, "10.0.0.7", cert.IPAddresses[0].String())
	require.Equal(t, []string{"i-1"}, cert.DNSNames, "names come from the record")
	rec, ok := f.records.Get("i-1")
	require.True(t, ok)
	require.NotNil(t, rec.Agent, "the record holds the registered key")
	require.Equal(t, cert.SerialNumber.String(), rec.Agent.Serial)
}

func TestConcurrentUseOfOneNonce(t *testing.T) {
	f := newFixture(t)
	tok := f.agentNonce(t)
	var ok, replayed atomic.Int32
	// Every caller uses another key: exactly one wins, the others are told
	// the nonce is used.
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := f.svc.RegisterAgent(context.Background(), &nstancev1.RegisterAgentRequest{Nonce: tok, PublicKeyPem: pubPEM(t)})
			switch status.Code(err) {
			case codes.OK:
				ok.Add(1)
			case codes.AlreadyExists:
				replayed.Add(1)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int32(1), ok.Load())
	require.Equal(t, int32(15), replayed.Load())
}

func TestRegisterOperatorRecordsRegistration(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	tok, err := nonce.Mint(f.nonceKey, nonce.Claims{Kind: nonce.KindOperator, ClusterID: "c1", Tenant: "acme", RegisteredClaims: jwt.RegisteredClaims{Subject: "op"}}, time.Hour, time.Now())
	require.NoError(t, err)
	resp, err := f.svc.RegisterOperator(ctx, &nstancev1.RegisterOperatorRequest{Nonce: tok, PublicKeyPem: pubPEM(t)})
	require.NoError(t, err)
	require.Equal(t, nstancev1.ClientRole_CLIENT_ROLE_OPERATOR, resp.GetIdentity().GetRole())
	require.WithinDuration(t, time.Now().Add(2*time.Hour), resp.GetExpiresAt().AsTime(), time.Minute)
	rec, err := f.store.Get(ctx, "cluster/operators/acme/op.json")
	require.NoError(t, err)
	require.Contains(t, string(rec.Body), `"tenant":"acme"`)
	// An operator nonce is refused by RegisterAgent for its kind.
	_, err = f.svc.RegisterAgent(ctx, &nstancev1.RegisterAgentRequest{Nonce: tok, PublicKeyPem: pubPEM(t)})
	require.Equal(t, codes.Unauthenticated, status.Code(err))
	require.Equal(t, msgInvalidNonce, status.Convert(err).Message())
}

func TestRegisterAdmin(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	tok, err := nonce.Mint(f.nonceKey, nonce.Claims{Kind: nonce.KindAdmin, ClusterID: "c1", Tenant: "acme", RegisteredClaims: jwt.RegisteredClaims{Subject: "adm"}}, time.Hour, time.Now())
	require.NoError(t, err)
	resp, err := f.svc.RegisterOperator(ctx, &nstancev1.RegisterOperatorRequest{Nonce: tok, PublicKeyPem: pubPEM(t)})
	require.NoError(t, err)
	require.Equal(t, nstancev1.ClientRole_CLIENT_ROLE_ADMIN, resp.GetIdentity().GetRole())
	require.Equal(t, "spiffe://c1/tenant/acme/admin/adm", resp.GetIdentity().GetUri())
	rec, err := f.store.Get(ctx, "cluster/operators/acme/adm.json")
	require.NoError(t, err)
	require.Contains(t, string(rec.Body), `"role":"admin"`)
}

// TestRefusalsAreGeneric: anonymous callers learn no cluster, shard or
// tenant id from a refusal; the server log has the reason.
func TestRefusalsAreGeneric(t *testing.T) {
	f := newFixture(t)
	var logged []string
	var mu sync.Mutex
	f.svc.Log = funcr.New(func(prefix, args string) {
		mu.Lock()
		logged = append(logged, args)
		mu.Unlock()
	}, funcr.Options{})
	ctx := context.Background()
	now := time.Now()
	mint := func(c nonce.Claims, ttl time.Duration, at time.Time) string {
		tok, err := nonce.Mint(f.nonceKey, c, ttl, at)
		require.NoError(t, err)
		return tok
	}
	agent := nonce.Claims{Kind: nonce.KindAgent, ClusterID: "c1", Tenant: "acme", Shard: "s1", Group: "web", RegisteredClaims: jwt.RegisteredClaims{Subject: "i-1"}}
	otherCluster, otherShard, unknown := agent, agent, agent
	unknown.Subject = "i-404"
	otherCluster.ClusterID = "secret-cluster-c2"
	otherShard.Shard = "secret-shard-s2"
	used := mint(agent, time.Minute, now)
	_, err := f.svc.RegisterAgent(ctx, &nstancev1.RegisterAgentRequest{Nonce: used, PublicKeyPem: pubPEM(t)})
	require.NoError(t, err)
	for name, tc := range map[string]struct {
		tok  string
		code codes.Code
		msg  string
		log  string
	}{
		"other cluster": {mint(otherCluster, time.Minute, now), codes.Unauthenticated, msgInvalidNonce, "secret-cluster-c2"},
		"other shard":   {mint(otherShard, time.Minute, now), codes.Unauthenticated, msgInvalidNonce, "secret-shard-s2"},
		"too long":      {mint(agent, 25*time.Hour, now), codes.Unauthenticated, msgInvalidNonce, "lifetime"},
		"expired":       {mint(agent, time.Minute, now.Add(-time.Hour)), codes.Unauthenticated, msgExpiredNonce, "expired"},
		"not yet valid": {mint(agent, time.Hour, now.Add(10*time.Minute)), codes.FailedPrecondition, msgEarlyNonce, "not valid yet"},
		"garbage":       {"a.b.c", codes.Unauthenticated, msgInvalidNonce, "well-formed"},
		"replayed":      {used, codes.AlreadyExists, msgUsedNonce, "already been used"},
		"no record":     {mint(unknown, time.Minute, now), codes.PermissionDenied, msgRefused, "i-404 has no record"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := f.svc.RegisterAgent(ctx, &nstancev1.RegisterAgentRequest{Nonce: tc.tok, PublicKeyPem: pubPEM(t)})
			st := status.Convert(err)
			require.Equal(t, tc.code, st.Code())
			require.Equal(t, tc.msg, st.Message())
			for _, secret := range []string{"c1", "s1", "acme", "c2", "s2", "i-1", "i-404"} {
				require.NotContains(t, st.Message(), secret)
			}
			mu.Lock()
			defer mu.Unlock()
			require.Contains(t, logged[len(logged)-1], tc.log, "the reason is in the server log")
		})
	}
}

// TestOperatorIDsArePerTenant: tenant beta registering operator "op"
// leaves tenant acme's record of "op" as it was (finding 7).
func TestOperatorIDsArePerTenant(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for _, tenant := range []string{"acme", "beta"} {
		tok, err := nonce.Mint(f.nonceKey, nonce.Claims{Kind: nonce.KindOperator, ClusterID: "c1", Tenant: tenant, RegisteredClaims: jwt.RegisteredClaims{Subject: "op"}}, time.Hour, time.Now())
		require.NoError(t, err)
		_, err = f.svc.RegisterOperator(ctx, &nstancev1.RegisterOperatorRequest{Nonce: tok, PublicKeyPem: pubPEM(t)})
		require.NoError(t, err)
	}
	for _, tenant := range []string{"acme", "beta"} {
		st, err := ReadOperatorRecord(ctx, f.store, f.svc.Keys, tenant, "op")
		require.NoError(t, err)
		require.Equal(t, tenant, st.Record.Tenant)
		require.Equal(t, "spiffe://c1/tenant/"+tenant+"/operator/op", st.Record.URI)
		require.False(t, st.Legacy)
	}
	_, err := ReadOperatorRecord(ctx, f.store, f.svc.Keys, "gamma", "op")
	require.ErrorIs(t, err, objstore.ErrNotFound)
}

// TestReadOperatorRecordLegacy: a record of an older version
// (cluster/operators/{id}.json) is read for the tenant it names only, and
// a record at the tenant's own key wins over it.
func TestReadOperatorRecordLegacy(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	keys := f.svc.Keys
	_, err := f.store.Put(ctx, keys.LegacyOperator("op"), []byte(`{"id":"op","tenant":"acme","serial":"1"}`), objstore.PutOptions{})
	require.NoError(t, err)
	st, err := ReadOperatorRecord(ctx, f.store, keys, "acme", "op")
	require.NoError(t, err)
	require.True(t, st.Legacy)
	require.Equal(t, keys.LegacyOperator("op"), st.Key)
	_, err = ReadOperatorRecord(ctx, f.store, keys, "beta", "op")
	require.ErrorIs(t, err, objstore.ErrNotFound, "the legacy record is acme's")

	require.NoError(t, WriteOperatorRecord(ctx, f.store, keys, OperatorRecord{ID: "op", Tenant: "acme", Serial: "2"}))
	st, err = ReadOperatorRecord(ctx, f.store, keys, "acme", "op")
	require.NoError(t, err)
	require.False(t, st.Legacy)
	require.Equal(t, "2", st.Record.Serial)

	_, err = f.store.Put(ctx, keys.LegacyOperator("junk"), []byte(`{`), objstore.PutOptions{})
	require.NoError(t, err)
	_, err = ReadOperatorRecord(ctx, f.store, keys, "acme", "junk")
	require.ErrorIs(t, err, objstore.ErrNotFound, "an unreadable legacy record is nobody's")
	_, err = ReadOperatorRecord(ctx, f.store, keys, "acme", "../x")
	require.Error(t, err)
}
