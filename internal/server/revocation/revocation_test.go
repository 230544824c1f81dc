package revocation_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/revocation"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

type fixture struct {
	ca    *pki.CA
	store objstore.Store
	keys  layout.Keys
	clock *clock
}

func newFixture(t *testing.T) *fixture {
	ca, err := pki.GenerateCA("c1", 24*time.Hour, time.Now())
	require.NoError(t, err)
	return &fixture{ca: ca, store: memstore.New(), keys: layout.New("pfx"), clock: &clock{now: time.Now()}}
}

func (f *fixture) gate(shard string) *revocation.Gate {
	return revocation.New(revocation.Options{Store: f.store, Keys: f.keys, ClusterID: "c1", Shard: shard, ServerID: "srv",
		OperatorValidity: 2 * time.Hour, AgentValidity: time.Hour, Now: f.clock.Now})
}

func (f *fixture) cert(t *testing.T, id pki.Identity, at time.Time) *x509.Certificate {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	id.ClusterID = "c1"
	c, _, err := f.ca.IssueClient(pki.ClientRequest{Identity: id, PublicKey: pub, Validity: time.Hour}, at)
	require.NoError(t, err)
	return c
}

func ident(c *x509.Certificate) pki.Identity {
	id, err := pki.IdentityFromCert(c, "c1")
	if err != nil {
		panic(err)
	}
	return id
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestOperatorEntryNamesOnlyEarlierCertificatesOfThatOperator(t *testing.T) {
	f := newFixture(t)
	g := f.gate("s1")
	before := f.cert(t, pki.Identity{Tenant: "acme", Role: pki.RoleOperator, ClientID: "op-a"}, f.clock.Now().Add(-time.Minute))
	admin := f.cert(t, pki.Identity{Tenant: "acme", Role: pki.RoleAdmin, ClientID: "op-a"}, f.clock.Now().Add(-time.Minute))
	other := f.cert(t, pki.Identity{Tenant: "acme", Role: pki.RoleOperator, ClientID: "op-b"}, f.clock.Now().Add(-time.Minute))
	agent := f.cert(t, pki.Identity{Tenant: "acme", Role: pki.RoleAgent, ClientID: "op-a", Shard: "s1"}, f.clock.Now().Add(-time.Minute))

	e, err := g.Revoke(ctx(t), revocation.Entry{Kind: revocation.KindOperator, Subject: "op-a", Reason: "left"})
	require.NoError(t, err)
	require.Equal(t, f.clock.Now().UTC(), e.IssuedBefore)
	require.Equal(t, e.IssuedBefore.Add(2*time.Hour+time.Minute), e.ExpiresAt, "kept for the operator validity")
	require.Equal(t, "srv", e.RevokedBy)

	require.ErrorIs(t, g.Admit(before, ident(before)), revocation.ErrRevoked)
	require.ErrorIs(t, g.Admit(admin, ident(admin)), revocation.ErrRevoked)
	require.NoError(t, g.Admit(other, ident(other)))
	require.NoError(t, g.Admit(agent, ident(agent)), "an agent of the same id is another identity")

	// Re-registered later: a certificate issued after the revocation is fine.
	f.clock.add(2 * time.Second)
	after := f.cert(t, pki.Identity{Tenant: "acme", Role: pki.RoleOperator, ClientID: "op-a"}, f.clock.Now())
	require.NoError(t, g.Admit(after, ident(after)))

	_, err = f.store.Head(ctx(t), f.keys.ClusterRevocation(e.ID))
	require.NoError(t, err, "operator entries are cluster-wide")
}

func TestAgentAndSerialEntries(t *testing.T) {
	f := newFixture(t)
	g1, g2 := f.gate("s1"), f.gate("s2")
	now := f.clock.Now()
	a1 := f.cert(t, pki.Identity{Tenant: "acme", Role: pki.RoleAgent, ClientID: "i-1", Shard: "s1"}, now)
	a1other := f.cert(t, pki.Identity{Tenant: "acme", Role: pki.RoleAgent, ClientID: "i-1", Shard: "s2"}, now)
	op := f.cert(t, pki.Identity{Tenant: "acme", Role: pki.RoleOperator, ClientID: "op-z"}, now)

	e, err := g1.RevokeAgent(ctx(t), "i-1", "instance deleted")
	require.NoError(t, err)
	require.Equal(t, e.IssuedBefore.Add(time.Hour+time.Minute), e.ExpiresAt)
	_, err = f.store.Head(ctx(t), f.keys.ShardRevocation("s1", e.ID))
	require.NoError(t, err, "agent entries live under their shard")
	require.ErrorIs(t, g1.Admit(a1, ident(a1)), revocation.ErrRevoked)
	require.NoError(t, g1.Admit(a1other, ident(a1other)), "the same instance id on another shard")

	_, err = g1.Revoke(ctx(t), revocation.Entry{Kind: revocation.KindSerial, Serial: op.SerialNumber.String()})
	require.NoError(t, err)
	require.ErrorIs(t, g1.Admit(op, ident(op)), revocation.ErrRevoked)

	// The other shard's server loads serial (cluster) entries, not s1's agent entries.
	require.NoError(t, g2.Sync(ctx(t)))
	require.ErrorIs(t, g2.Admit(op, ident(op)), revocation.ErrRevoked)
	require.NoError(t, g2.Admit(a1other, ident(a1other)))
	require.Len(t, g2.Entries(), 1)

	// Bad input is refused and writes nothing.
	for _, bad := range []revocation.Entry{
		{Kind: revocation.KindSerial, Serial: "12ab"},
		{Kind: revocation.KindOperator, Subject: "../x"},
		{Kind: revocation.KindAgent, Subject: "i-1"},
		{Kind: "everything"},
	} {
		_, err := g1.Revoke(ctx(t), bad)
		require.Error(t, err, "%+v", bad)
	}
	infos, err := f.store.List(ctx(t), "pfx/")
	require.NoError(t, err)
	require.Len(t, infos, 2)
}

func TestSyncLoadsPrunesAndSkipsBrokenEntries(t *testing.T) {
	f := newFixture(t)
	writer, reader := f.gate("s1"), f.gate("s1")
	c := f.cert(t, pki.Identity{Tenant: "acme", Role: pki.RoleAgent, ClientID: "i-1", Shard: "s1"}, f.clock.Now())
	e, err := writer.RevokeAgent(ctx(t), "i-1", "")
	require.NoError(t, err)
	_, err = f.store.Put(ctx(t), f.keys.ShardRevocation("s1", "broken"), []byte("{"), objstore.PutOptions{})
	require.NoError(t, err)

	require.NoError(t, reader.Sync(ctx(t)), "a broken entry is logged and skipped")
	require.ErrorIs(t, reader.Admit(c, ident(c)), revocation.ErrRevoked)

	f.clock.add(time.Hour + 2*time.Minute)
	require.NoError(t, reader.Sync(ctx(t)))
	require.NoError(t, reader.Admit(c, ident(c)))
	require.Empty(t, reader.Entries())
	_, err = f.store.Head(ctx(t), f.keys.ShardRevocation("s1", e.ID))
	require.ErrorIs(t, err, objstore.ErrNotFound, "expired entries are removed from storage")
	_, err = f.store.Head(ctx(t), f.keys.ShardRevocation("s1", "broken"))
	require.NoError(t, err, "a broken entry stays for a person to look at")
}

func TestVanishedOperatorRecordIsRevokedOnce(t *testing.T) {
	f := newFixture(t)
	g1, g2 := f.gate("s1"), f.gate("s2")
	c := f.cert(t, pki.Identity{Tenant: "acme", Role: pki.RoleOperator, ClientID: "op-a"}, f.clock.Now())
	for _, id := range []string{"op-a", "op-b"} {
		_, err := f.store.Put(ctx(t), f.keys.Operator("acme", id), []byte(`{"id":"`+id+`"}`), objstore.PutOptions{})
		require.NoError(t, err)
	}
	require.NoError(t, g1.Sync(ctx(t)))
	require.NoError(t, g2.Sync(ctx(t)))
	require.NoError(t, g1.Admit(c, ident(c)))

	require.NoError(t, f.store.Delete(ctx(t), f.keys.Operator("acme", "op-a")))
	require.NoError(t, g1.Sync(ctx(t)))
	require.NoError(t, g2.Sync(ctx(t)))
	for _, g := range []*revocation.Gate{g1, g2} {
		require.ErrorIs(t, g.Admit(c, ident(c)), revocation.ErrRevoked)
	}
	infos, err := f.store.List(ctx(t), f.keys.ClusterRevocationPrefix())
	require.NoError(t, err)
	require.Len(t, infos, 1, "both shards derived the same entry")
}

func TestRevokeOperatorDeletesItsRecord(t *testing.T) {
	f := newFixture(t)
	g := f.gate("s1")
	_, err := f.store.Put(ctx(t), f.keys.Operator("acme", "op-a"), []byte(`{"id":"op-a","uri":"spiffe://c1/tenant/acme/operator/op-a"}`), objstore.PutOptions{})
	require.NoError(t, err)
	require.NoError(t, g.Sync(ctx(t)))
	e, err := g.RevokeOperator(ctx(t), "acme", "op-a", "test")
	require.NoError(t, err)
	require.Equal(t, "spiffe://c1/tenant/acme/operator/op-a", e.URI)
	_, err = f.store.Head(ctx(t), f.keys.Operator("acme", "op-a"))
	require.ErrorIs(t, err, objstore.ErrNotFound)
	// Its own Sync does not write a second entry for the vanished record.
	require.NoError(t, g.Sync(ctx(t)))
	require.Len(t, g.Entries(), 1)
	// An unknown operator can be revoked too (its certificates outlive a lost record).
	_, err = g.RevokeOperator(ctx(t), "acme", "op-never", "")
	require.NoError(t, err)
	_, err = g.RevokeOperator(ctx(t), "acme", "bad/id", "")
	require.ErrorIs(t, err, revocation.ErrInvalid)
	_, err = g.RevokeOperator(ctx(t), "", "op-a", "")
	require.ErrorIs(t, err, revocation.ErrInvalid, "the tenant is required")
}

func TestTrackedStreamsEndOnRevocation(t *testing.T) {
	f := newFixture(t)
	g := f.gate("s1")
	a := f.cert(t, pki.Identity{Tenant: "acme", Role: pki.RoleOperator, ClientID: "op-a"}, f.clock.Now())
	b := f.cert(t, pki.Identity{Tenant: "acme", Role: pki.RoleOperator, ClientID: "op-b"}, f.clock.Now())
	ctxA, doneA := g.Track(ctx(t), a, ident(a))
	defer doneA()
	ctxB, doneB := g.Track(ctx(t), b, ident(b))
	defer doneB()
	_, err := g.Revoke(ctx(t), revocation.Entry{Kind: revocation.KindSerial, Serial: a.SerialNumber.String()})
	require.NoError(t, err)
	select {
	case <-ctxA.Done():
		require.True(t, errors.Is(context.Cause(ctxA), revocation.ErrRevoked), "%v", context.Cause(ctxA))
	case <-time.After(5 * time.Second):
		t.Fatal("the revoked stream was not cancelled")
	}
	require.NoError(t, ctxB.Err())
	doneB()
	require.ErrorIs(t, context.Cause(ctxB), context.Canceled)
}

func TestRequireOperatorRecords(t *testing.T) {
	f := newFixture(t)
	g := revocation.New(revocation.Options{Store: f.store, Keys: f.keys, ClusterID: "c1", Shard: "s1", OperatorValidity: time.Hour,
		AgentValidity: time.Hour, RequireOperatorRecords: true, Now: f.clock.Now})
	require.NoError(t, g.Sync(ctx(t)))
	op := f.cert(t, pki.Identity{Tenant: "acme", Role: pki.RoleOperator, ClientID: "op-a"}, f.clock.Now())
	agent := f.cert(t, pki.Identity{Tenant: "acme", Role: pki.RoleAgent, ClientID: "i-1", Shard: "s1"}, f.clock.Now())
	require.ErrorIs(t, g.Admit(op, ident(op)), revocation.ErrRevoked, "no record")
	require.NoError(t, g.Admit(agent, ident(agent)), "agents have no operator record")

	_, err := f.store.Put(ctx(t), f.keys.Operator("acme", "op-a"), []byte(`{"id":"op-a"}`), objstore.PutOptions{})
	require.NoError(t, err)
	require.ErrorIs(t, g.Admit(op, ident(op)), revocation.ErrRevoked, "a miss is remembered until the next Sync")
	require.NoError(t, g.Sync(ctx(t)))
	require.NoError(t, g.Admit(op, ident(op)))

	streamCtx, done := g.Track(ctx(t), op, ident(op))
	defer done()
	require.NoError(t, f.store.Delete(ctx(t), f.keys.Operator("acme", "op-a")))
	require.NoError(t, g.Admit(op, ident(op)), "an RPC answers from the last Sync")
	require.ErrorIs(t, g.AdmitHandshake(op, ident(op)), revocation.ErrRevoked, "a handshake reads the record")
	require.ErrorIs(t, g.Admit(op, ident(op)), revocation.ErrRevoked, "and RPCs follow what it found")
	require.NoError(t, g.Sync(ctx(t)))
	require.ErrorIs(t, g.Admit(op, ident(op)), revocation.ErrRevoked)
	require.Len(t, g.Entries(), 1, "the vanished record still gets its entry")
	select {
	case <-streamCtx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the stream of an operator whose record is gone was not ended")
	}
}

// TestStandbySyncOnlyReads: a standby keeps the list loaded without
// writing (no pruning, no revocation of a vanished operator); once it
// leads, the next Sync does both.
func TestStandbySyncOnlyReads(t *testing.T) {
	f := newFixture(t)
	var standby atomic.Bool
	standby.Store(true)
	g := revocation.New(revocation.Options{Store: f.store, Keys: f.keys, ClusterID: "c1", Shard: "s1", ServerID: "srv",
		OperatorValidity: 2 * time.Hour, AgentValidity: time.Hour, Now: f.clock.Now, Standby: standby.Load})
	require.True(t, g.SyncedAt().IsZero())
	e, err := f.gate("s1").RevokeAgent(ctx(t), "i-1", "")
	require.NoError(t, err)
	_, err = f.store.Put(ctx(t), f.keys.Operator("acme", "op-a"), []byte(`{"id":"op-a"}`), objstore.PutOptions{})
	require.NoError(t, err)
	c := f.cert(t, pki.Identity{Tenant: "acme", Role: pki.RoleAgent, ClientID: "i-1", Shard: "s1"}, f.clock.Now())
	require.NoError(t, g.Sync(ctx(t)))
	require.ErrorIs(t, g.Admit(c, ident(c)), revocation.ErrRevoked, "a standby loads the list")
	require.Equal(t, f.clock.Now(), g.SyncedAt())

	require.NoError(t, f.store.Delete(ctx(t), f.keys.Operator("acme", "op-a")))
	f.clock.add(time.Hour + 2*time.Minute)
	require.NoError(t, g.Sync(ctx(t)))
	require.NoError(t, g.Admit(c, ident(c)), "the expired entry is out of memory")
	_, err = f.store.Head(ctx(t), f.keys.ShardRevocation("s1", e.ID))
	require.NoError(t, err, "but a standby deletes nothing")
	infos, err := f.store.List(ctx(t), f.keys.ClusterRevocationPrefix())
	require.NoError(t, err)
	require.Empty(t, infos, "nor revokes the vanished operator")

	standby.Store(false)
	require.NoError(t, g.Sync(ctx(t)))
	_, err = f.store.Head(ctx(t), f.keys.ShardRevocation("s1", e.ID))
	require.ErrorIs(t, err, objstore.ErrNotFound, "the leader prunes")
	infos, err = f.store.List(ctx(t), f.keys.ClusterRevocationPrefix())
	require.NoError(t, err)
	require.Len(t, infos, 1, "and revokes the operator whose record vanished")
}

// requireGate is a gate that admits operators only with a record.
func (f *fixture) requireGate(shard string) *revocation.Gate {
	return revocation.New(revocation.Options{Store: f.store, Keys: f.keys, ClusterID: "c1", Shard: shard, ServerID: "srv",
		OperatorValidity: 2 * time.Hour, AgentValidity: time.Hour, RequireOperatorRecords: true, Now: f.clock.Now})
}

func (f *fixture) putRecord(t *testing.T, key, tenant, id string) {
	t.Helper()
	_, err := f.store.Put(ctx(t), key, []byte(`{"id":"`+id+`","tenant":"`+tenant+`","uri":"spiffe://c1/tenant/`+tenant+`/operator/`+id+`"}`), objstore.PutOptions{})
	require.NoError(t, err)
}

// TestOperatorIDsAreScopedToTheirTenant: tenants acme and beta both have
// operator "op-x". Revoking beta's, or deleting beta's record, leaves
// acme's admitted (finding 7 of the trust review).
func TestOperatorIDsAreScopedToTheirTenant(t *testing.T) {
	f := newFixture(t)
	g1, g2 := f.requireGate("s1"), f.requireGate("s2")
	f.putRecord(t, f.keys.Operator("acme", "op-x"), "acme", "op-x")
	f.putRecord(t, f.keys.Operator("beta", "op-x"), "beta", "op-x")
	f.putRecord(t, f.keys.Operator("beta", "op-y"), "beta", "op-y")
	acme := f.cert(t, pki.Identity{Tenant: "acme", Role: pki.RoleOperator, ClientID: "op-x"}, f.clock.Now())
	beta := f.cert(t, pki.Identity{Tenant: "beta", Role: pki.RoleOperator, ClientID: "op-x"}, f.clock.Now())
	betaY := f.cert(t, pki.Identity{Tenant: "beta", Role: pki.RoleAdmin, ClientID: "op-y"}, f.clock.Now())
	acmeY := f.cert(t, pki.Identity{Tenant: "acme", Role: pki.RoleOperator, ClientID: "op-y"}, f.clock.Now())
	for _, g := range []*revocation.Gate{g1, g2} {
		require.NoError(t, g.Sync(ctx(t)))
		require.NoError(t, g.AdmitHandshake(acme, ident(acme)))
		require.NoError(t, g.AdmitHandshake(beta, ident(beta)))
		require.ErrorIs(t, g.AdmitHandshake(acmeY, ident(acmeY)), revocation.ErrRevoked, "beta's record is not acme's")
	}
	tenants, err := g1.OperatorTenants(ctx(t), "op-x")
	require.NoError(t, err)
	require.Equal(t, []string{"acme", "beta"}, tenants)

	e, err := g1.RevokeOperator(ctx(t), "beta", "op-x", "beta's only")
	require.NoError(t, err)
	require.Equal(t, "beta", e.Tenant)
	_, err = f.store.Head(ctx(t), f.keys.Operator("acme", "op-x"))
	require.NoError(t, err, "acme's record stays")
	// Someone deletes beta's op-y record by hand: revoked for beta only.
	require.NoError(t, f.store.Delete(ctx(t), f.keys.Operator("beta", "op-y")))
	for _, g := range []*revocation.Gate{g1, g2} {
		require.NoError(t, g.Sync(ctx(t)))
		require.ErrorIs(t, g.AdmitHandshake(beta, ident(beta)), revocation.ErrRevoked)
		require.ErrorIs(t, g.Admit(betaY, ident(betaY)), revocation.ErrRevoked)
		require.NoError(t, g.AdmitHandshake(acme, ident(acme)), "acme's op-x is someone else")
		require.NoError(t, g.Admit(acme, ident(acme)))
	}
	for _, e := range g2.Entries() {
		require.Equal(t, "beta", e.Tenant, "%+v", e)
	}
	// A new beta op-x registered later is not denied by the entry.
	later := f.cert(t, pki.Identity{Tenant: "beta", Role: pki.RoleOperator, ClientID: "op-x"}, f.clock.Now().Add(time.Minute))
	f.putRecord(t, f.keys.Operator("beta", "op-x"), "beta", "op-x")
	require.NoError(t, g2.AdmitHandshake(later, ident(later)))
}

// TestLegacyOperatorRecords: a record of an older version
// (cluster/operators/{id}.json) is honoured for the tenant it names, and
// only for it; deleting it revokes that tenant's operator; revoking deletes
// it; an entry of an older version (no tenant) still denies the id
// everywhere until it expires.
func TestLegacyOperatorRecords(t *testing.T) {
	f := newFixture(t)
	g := f.requireGate("s1")
	f.putRecord(t, f.keys.LegacyOperator("op-l"), "acme", "op-l")
	f.putRecord(t, f.keys.LegacyOperator("op-m"), "acme", "op-m")
	_, err := f.store.Put(ctx(t), f.keys.LegacyOperator("op-bad"), []byte(`not json`), objstore.PutOptions{})
	require.NoError(t, err)
	acmeL := f.cert(t, pki.Identity{Tenant: "acme", Role: pki.RoleOperator, ClientID: "op-l"}, f.clock.Now())
	betaL := f.cert(t, pki.Identity{Tenant: "beta", Role: pki.RoleOperator, ClientID: "op-l"}, f.clock.Now())
	acmeM := f.cert(t, pki.Identity{Tenant: "acme", Role: pki.RoleOperator, ClientID: "op-m"}, f.clock.Now())
	bad := f.cert(t, pki.Identity{Tenant: "acme", Role: pki.RoleOperator, ClientID: "op-bad"}, f.clock.Now())

	require.NoError(t, g.Sync(ctx(t)))
	require.NoError(t, g.AdmitHandshake(acmeL, ident(acmeL)), "read through")
	require.NoError(t, g.Admit(acmeL, ident(acmeL)), "listed by Sync")
	require.ErrorIs(t, g.AdmitHandshake(betaL, ident(betaL)), revocation.ErrRevoked, "the legacy record names acme")
	require.ErrorIs(t, g.AdmitHandshake(bad, ident(bad)), revocation.ErrRevoked, "an unreadable legacy record is nobody's")
	ops, err := g.Operators(ctx(t))
	require.NoError(t, err)
	require.Len(t, ops, 2)
	require.Equal(t, []string{"acme", "op-l"}, []string{ops[0].Tenant, ops[0].ID})

	// beta registers op-l: its own record; acme's legacy one is untouched.
	f.putRecord(t, f.keys.Operator("beta", "op-l"), "beta", "op-l")
	require.NoError(t, g.Sync(ctx(t)))
	require.NoError(t, g.Admit(acmeL, ident(acmeL)))
	require.NoError(t, g.Admit(betaL, ident(betaL)))

	// The legacy record of op-m deleted by hand: acme's op-m is revoked.
	require.NoError(t, f.store.Delete(ctx(t), f.keys.LegacyOperator("op-m")))
	require.NoError(t, g.Sync(ctx(t)))
	require.ErrorIs(t, g.Admit(acmeM, ident(acmeM)), revocation.ErrRevoked)

	// acme re-registered op-m after the upgrade while the legacy record
	// stayed: revoking deletes both.
	f.putRecord(t, f.keys.LegacyOperator("op-n"), "acme", "op-n")
	f.putRecord(t, f.keys.Operator("acme", "op-n"), "acme", "op-n")
	_, err = g.RevokeOperator(ctx(t), "acme", "op-n", "")
	require.NoError(t, err)
	for _, k := range []string{f.keys.LegacyOperator("op-n"), f.keys.Operator("acme", "op-n")} {
		_, err = f.store.Head(ctx(t), k)
		require.ErrorIs(t, err, objstore.ErrNotFound, k)
	}

	// Revoking acme's op-l deletes the legacy record, not beta's.
	_, err = g.RevokeOperator(ctx(t), "acme", "op-l", "")
	require.NoError(t, err)
	_, err = f.store.Head(ctx(t), f.keys.LegacyOperator("op-l"))
	require.ErrorIs(t, err, objstore.ErrNotFound)
	require.NoError(t, g.Sync(ctx(t)))
	require.ErrorIs(t, g.Admit(acmeL, ident(acmeL)), revocation.ErrRevoked)
	require.NoError(t, g.Admit(betaL, ident(betaL)))

	// An entry of an older version names no tenant: it denies the id in
	// every tenant, as it did when it was written.
	_, err = g.Revoke(ctx(t), revocation.Entry{Kind: revocation.KindOperator, Subject: "op-l"})
	require.NoError(t, err)
	require.ErrorIs(t, g.Admit(betaL, ident(betaL)), revocation.ErrRevoked)
}
