package registration

import (
	"context"
	"crypto/x509"
	"errors"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/pkg/objstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func register(f *fixture, ctx context.Context, tok, key string, host string, ips ...string) (*nstancev1.RegisterAgentResponse, error) {
	return f.svc.RegisterAgent(ctx, &nstancev1.RegisterAgentRequest{Nonce: tok, PublicKeyPem: key, Hostname: host, IpAddresses: ips})
}

// TestRetryWithTheSameKeyGetsTheSameCertificate: the reply of a
// registration is lost; the agent retries with its key and gets the
// certificate issued first. Another key is refused as a replay.
func TestRetryWithTheSameKeyGetsTheSameCertificate(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	tok, key := f.agentNonce(t), pubPEM(t)
	first, err := register(f, ctx, tok, key, "")
	require.NoError(t, err)
	again, err := register(f, ctx, tok, key, "")
	require.NoError(t, err)
	require.Equal(t, first.GetCertificatePem(), again.GetCertificatePem())
	require.Equal(t, first.GetExpiresAt().AsTime(), again.GetExpiresAt().AsTime())
	_, err = register(f, ctx, tok, pubPEM(t), "")
	require.Equal(t, codes.AlreadyExists, status.Code(err), "%v", err)
	require.Equal(t, msgUsedNonce, status.Convert(err).Message())

	// A second nonce for the same instance (a relaunch minted another)
	// cannot register another key either.
	_, err = register(f, ctx, f.agentNonce(t), pubPEM(t), "")
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	// With the registered key it is the same registration.
	_, err = register(f, ctx, f.agentNonce(t), key, "")
	require.NoError(t, err)
}

// TestNonceForAnotherInstance: a nonce minted for X cannot register as Y,
// neither by asking for Y's name nor by claims that do not match Y's record;
// the refusals do not spend the nonce.
func TestNonceForAnotherInstance(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.addRecord(t, &instances.Record{ID: "i-2", Tenant: "acme", GroupID: "db", Shard: "s1", State: instances.StateRunning})
	tokX := f.agentNonce(t)
	for name, tc := range map[string]struct {
		tok, host string
		ips       []string
	}{
		"hostname of Y":              {tokX, "i-2", nil},
		"an IP X does not have":      {tokX, "", []string{"10.9.9.9"}},
		"claims of X's group for Y":  {f.agentNonceFor(t, "i-2", "web"), "", nil},
		"nonce for a missing record": {f.agentNonceFor(t, "i-3", "web"), "", nil},
	} {
		_, err := register(f, ctx, tc.tok, pubPEM(t), tc.host, tc.ips...)
		require.Equal(t, codes.PermissionDenied, status.Code(err), "%s: %v", name, err)
		require.Equal(t, msgRefused, status.Convert(err).Message(), name)
	}
	resp, err := register(f, ctx, tokX, pubPEM(t), "i-1")
	require.NoError(t, err, "the refusals did not spend the nonce")
	require.Equal(t, "i-1", resp.GetIdentity().GetClientId())
	rec, _ := f.records.Get("i-2")
	require.Nil(t, rec.Agent)
}

// TestStaleIndexCannotAdmit: Admit reads the leader's index, which another
// writer (the last leader, just before it was fenced) may have left behind.
// Bind writes only over the stored record it re-checks, so a stale index
// admits nothing: neither a second key for a registered instance nor an
// instance on its way out.
func TestStaleIndexCannotAdmit(t *testing.T) {
	ctx := context.Background()
	for name, change := range map[string]func(r *instances.Record){
		"registered meanwhile with another key": func(r *instances.Record) {
			r.Agent = &instances.AgentRegistration{KeySHA256: "another", NonceID: "other-jti"}
		},
		"marked for deletion meanwhile": func(r *instances.Record) { r.State = instances.StatePendingDeletion },
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			other := instances.NewStore(f.store, layout.New(""), "s1", nil)
			_, err := other.Refresh(ctx, "i-1")
			require.NoError(t, err)
			_, err = other.Update(ctx, "i-1", func(r *instances.Record) error { change(r); return nil })
			require.NoError(t, err)
			stale, _ := f.records.Get("i-1")
			require.Nil(t, stale.Agent, "the fixture's index has not seen the change")
			require.Equal(t, instances.StateRunning, stale.State)

			_, err = register(f, ctx, f.agentNonce(t), pubPEM(t), "")
			require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
			rec, err := f.records.Refresh(ctx, "i-1")
			require.NoError(t, err)
			if rec.Agent != nil {
				require.Equal(t, "another", rec.Agent.KeySHA256, "the stored registration stands")
			}
		})
	}
}

// TestInstanceStateGatesRegistration: an instance on its way out does not
// register.
func TestInstanceStateGatesRegistration(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for _, st := range []instances.State{instances.StatePendingDeletion, instances.StateDeleting} {
		_, err := f.records.Update(ctx, "i-1", func(r *instances.Record) error { r.State = st; return nil })
		require.NoError(t, err)
		_, err = register(f, ctx, f.agentNonce(t), pubPEM(t), "")
		require.Equal(t, codes.PermissionDenied, status.Code(err), "%s: %v", st, err)
	}
	for _, st := range []instances.State{instances.StatePending, instances.StateCreating, instances.StateStopped} {
		g := newFixture(t)
		_, err := g.records.Update(ctx, "i-1", func(r *instances.Record) error { r.State = st; return nil })
		require.NoError(t, err)
		_, err = register(g, ctx, g.agentNonce(t), pubPEM(t), "")
		require.NoError(t, err, st)
	}
}

// TestSourceAddress: with provider addresses on the record, the caller must
// come from one of them, unless it comes through a trusted proxy or the
// check is off.
func TestSourceAddress(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	_, err := f.records.Update(ctx, "i-1", func(r *instances.Record) error { r.Addresses = []string{"10.0.0.7", "fd00::7"}; return nil })
	require.NoError(t, err)
	tok := f.agentNonce(t)
	for _, src := range []string{"10.0.0.8", "192.168.1.7"} {
		_, err = register(f, from(src), tok, pubPEM(t), "")
		require.Equal(t, codes.PermissionDenied, status.Code(err), "%s: %v", src, err)
	}
	_, err = register(f, ctx, tok, pubPEM(t), "")
	require.Equal(t, codes.PermissionDenied, status.Code(err), "unknown source")

	f.policy = SourcePolicy{TrustedProxies: []netip.Prefix{netip.MustParsePrefix("192.168.1.0/24")}}
	resp, err := register(f, from("192.168.1.7"), tok, pubPEM(t), "")
	require.NoError(t, err, "through a trusted proxy")
	cert, err := parseCert(resp.GetCertificatePem())
	require.NoError(t, err)
	require.Len(t, cert.IPAddresses, 2, "the record's addresses")

	g := newFixture(t)
	_, err = g.records.Update(ctx, "i-1", func(r *instances.Record) error { r.Addresses = []string{"10.0.0.7"}; return nil })
	require.NoError(t, err)
	_, err = register(g, from("::ffff:10.0.0.7"), g.agentNonce(t), pubPEM(t), "")
	require.NoError(t, err, "an IPv4-mapped source is the IPv4 address")
	h := newFixture(t)
	_, err = h.records.Update(ctx, "i-1", func(r *instances.Record) error { r.Addresses = []string{"10.0.0.7"}; return nil })
	require.NoError(t, err)
	h.policy = SourcePolicy{Off: true}
	_, err = register(h, from("10.1.1.1"), h.agentNonce(t), pubPEM(t), "")
	require.NoError(t, err, "check off")
}

// TestProviderAddressesWhenTheRecordHasNone: the gate asks the provider; a
// provider failure is transient.
func TestProviderAddressesWhenTheRecordHasNone(t *testing.T) {
	f := newFixture(t)
	var fail atomic.Bool
	fail.Store(true)
	f.svc.Instances.ProviderAddresses = func(ctx context.Context, id string) ([]string, error) {
		if fail.Load() {
			return nil, errors.New("provider down")
		}
		return []string{"10.0.0.9"}, nil
	}
	tok, key := f.agentNonce(t), pubPEM(t)
	_, err := register(f, from("10.0.0.9"), tok, key, "")
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	fail.Store(false)
	_, err = register(f, from("10.0.0.1"), tok, key, "")
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	resp, err := register(f, from("10.0.0.9"), tok, key, "")
	require.NoError(t, err)
	cert, err := parseCert(resp.GetCertificatePem())
	require.NoError(t, err)
	require.Equal(t, "10.0.0.9", cert.IPAddresses[0].String())
}

// failingStore fails writes to keys containing match while fail is set.
type failingStore struct {
	objstore.Store
	match string
	fail  atomic.Int32
}

func (s *failingStore) Put(ctx context.Context, key string, body []byte, o objstore.PutOptions) (string, error) {
	if strings.Contains(key, s.match) && s.fail.Add(-1) >= 0 {
		return "", errors.New("storage unreachable")
	}
	return s.Store.Put(ctx, key, body, o)
}

// TestBindFailureIsRetried: the nonce is spent but the record write fails;
// the agent is told to retry and, with the same key, gets the same
// certificate and its record bound.
func TestBindFailureIsRetried(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	fs := &failingStore{Store: f.store, match: "/instances/"}
	f.records = instances.NewStore(fs, f.svc.Keys, "s1", nil)
	require.NoError(t, f.records.Load(ctx))
	f.svc.Instances.Records = f.records
	fs.fail.Store(1)
	tok, key := f.agentNonce(t), pubPEM(t)
	_, err := register(f, ctx, tok, key, "")
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	resp, err := register(f, ctx, tok, key, "")
	require.NoError(t, err)
	rec, _ := f.records.Get("i-1")
	require.NotNil(t, rec.Agent)
	cert, err := parseCert(resp.GetCertificatePem())
	require.NoError(t, err)
	require.Equal(t, cert.SerialNumber.String(), rec.Agent.Serial)
}

// TestMarkerWriteFailureIsTransient: storage failing on the marker write is
// Unavailable, and nothing is spent.
func TestMarkerWriteFailureIsTransient(t *testing.T) {
	f := newFixture(t)
	fs := &failingStore{Store: f.store, match: "/nonces/"}
	f.svc.Ledger.Store = fs
	fs.fail.Store(1)
	tok, key := f.agentNonce(t), pubPEM(t)
	_, err := register(f, context.Background(), tok, key, "")
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	_, err = register(f, context.Background(), tok, pubPEM(t), "")
	require.NoError(t, err, "the nonce was not spent")
}

// TestNoGateRefusesAgents: a server without instance records admits no agent.
func TestNoGateRefusesAgents(t *testing.T) {
	f := newFixture(t)
	f.svc.Instances = nil
	_, err := register(f, context.Background(), f.agentNonce(t), pubPEM(t), "")
	require.Equal(t, codes.PermissionDenied, status.Code(err))
}

func parseCert(p string) (*x509.Certificate, error) { return pki.ParseCertificatePEM([]byte(p)) }

// TestOperatorRecordFailureIsRetried: the operator's certificate is issued
// but its record cannot be written; the caller is told to retry (its
// certificate would be refused without the record) and, with the same key,
// gets the same certificate and its record.
func TestOperatorRecordFailureIsRetried(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	fs := &failingStore{Store: f.store, match: "/operators/"}
	f.svc.Objects = fs
	fs.fail.Store(1)
	tok, err := nonce.Mint(f.nonceKey, nonce.Claims{Kind: nonce.KindOperator, ClusterID: "c1", Tenant: "acme", RegisteredClaims: jwt.RegisteredClaims{Subject: "op"}}, time.Hour, time.Now())
	require.NoError(t, err)
	key := pubPEM(t)
	_, err = f.svc.RegisterOperator(ctx, &nstancev1.RegisterOperatorRequest{Nonce: tok, PublicKeyPem: key})
	require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
	_, err = f.store.Get(ctx, "cluster/operators/acme/op.json")
	require.ErrorIs(t, err, objstore.ErrNotFound)
	resp, err := f.svc.RegisterOperator(ctx, &nstancev1.RegisterOperatorRequest{Nonce: tok, PublicKeyPem: key})
	require.NoError(t, err)
	rec, err := f.store.Get(ctx, "cluster/operators/acme/op.json")
	require.NoError(t, err)
	cert, err := parseCert(resp.GetCertificatePem())
	require.NoError(t, err)
	require.Contains(t, string(rec.Body), cert.SerialNumber.String(), "the record names the certificate the caller holds")
	// Another key is still refused.
	_, err = f.svc.RegisterOperator(ctx, &nstancev1.RegisterOperatorRequest{Nonce: tok, PublicKeyPem: pubPEM(t)})
	require.Equal(t, codes.AlreadyExists, status.Code(err))
}
