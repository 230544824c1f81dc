package nonce

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

func keys(t *testing.T) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	return pub, priv
}

func TestVerify(t *testing.T) {
	pub, priv := keys(t)
	_, foreign := keys(t)
	now := time.Now()
	v := &Verifier{Key: pub, ClusterID: "c1", Shard: "s1", Now: func() time.Time { return now }}
	op := Claims{Kind: KindOperator, ClusterID: "c1", Tenant: "default", RegisteredClaims: jwt.RegisteredClaims{Subject: "op"}}
	agent := Claims{Kind: KindAgent, ClusterID: "c1", Tenant: "default", Shard: "s1", Group: "g", RegisteredClaims: jwt.RegisteredClaims{Subject: "i-1"}}
	mint := func(c Claims, key ed25519.PrivateKey, ttl time.Duration, at time.Time) string {
		tok, err := Mint(key, c, ttl, at)
		require.NoError(t, err)
		return tok
	}
	signed := func(m jwt.SigningMethod, key any, c Claims) string {
		c.ID = "jti1"
		c.IssuedAt = jwt.NewNumericDate(now)
		c.NotBefore = jwt.NewNumericDate(now)
		c.ExpiresAt = jwt.NewNumericDate(now.Add(time.Hour))
		tok, err := jwt.NewWithClaims(m, c).SignedString(key)
		require.NoError(t, err)
		return tok
	}
	noneTok := signed(jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, op)
	hsTok := signed(jwt.SigningMethodHS256, []byte(pub), op)
	wrongCluster := op
	wrongCluster.ClusterID = "c2"
	wrongShard := agent
	wrongShard.Shard = "s2"
	future := op
	future.NotBefore = jwt.NewNumericDate(now.Add(time.Hour))
	// A token whose header claims EdDSA but whose payload was swapped.
	good := mint(op, priv, time.Hour, now)
	parts := strings.Split(good, ".")
	parts[1] = base64.RawURLEncoding.EncodeToString([]byte(`{"kind":"operator","cluster":"c1","tenant":"evil","sub":"op","jti":"x","exp":9999999999,"nbf":1}`))
	tampered := strings.Join(parts, ".")

	tests := []struct {
		name    string
		token   string
		kind    Kind
		wantErr error
	}{
		{"valid operator", good, KindOperator, nil},
		{"valid agent", mint(agent, priv, time.Minute, now), KindAgent, nil},
		{"expired", mint(op, priv, time.Minute, now.Add(-2*time.Minute)), KindOperator, ErrExpired},
		{"not yet valid", mint(future, priv, 2*time.Hour, now), KindOperator, ErrNotYetValid},
		{"wrong cluster", mint(wrongCluster, priv, time.Hour, now), KindOperator, ErrWrongCluster},
		{"wrong kind", mint(agent, priv, time.Hour, now), KindOperator, ErrWrongKind},
		{"wrong shard", mint(wrongShard, priv, time.Hour, now), KindAgent, ErrWrongShard},
		{"alg none", noneTok, KindOperator, ErrAlgorithm},
		{"HS256 with public key", hsTok, KindOperator, ErrAlgorithm},
		{"foreign key", mint(op, foreign, time.Hour, now), KindOperator, ErrSignature},
		{"tampered payload", tampered, KindOperator, ErrSignature},
		{"garbage", "not.a.jwt", KindOperator, ErrMalformed},
		{"empty", "", KindOperator, ErrMalformed},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := v.Verify(tc.token, tc.kind)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				require.Nil(t, c)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.kind, c.Kind)
			require.NotEmpty(t, c.ID)
		})
	}
}

func TestVerifyLifetime(t *testing.T) {
	pub, priv := keys(t)
	now := time.Now().Truncate(time.Second)
	v := &Verifier{Key: pub, ClusterID: "c1", Shard: "s1", Leeway: 5 * time.Second, Now: func() time.Time { return now }}
	op := Claims{Kind: KindOperator, ClusterID: "c1", Tenant: "default", RegisteredClaims: jwt.RegisteredClaims{Subject: "op", ID: "j1"}}
	// raw signs exactly the given times (nil leaves the claim out).
	raw := func(iat, nbf, exp *time.Time) string {
		c := op
		if iat != nil {
			c.IssuedAt = jwt.NewNumericDate(*iat)
		}
		if nbf != nil {
			c.NotBefore = jwt.NewNumericDate(*nbf)
		}
		if exp != nil {
			c.ExpiresAt = jwt.NewNumericDate(*exp)
		}
		tok, err := jwt.NewWithClaims(jwt.SigningMethodEdDSA, c).SignedString(priv)
		require.NoError(t, err)
		return tok
	}
	at := func(d time.Duration) *time.Time { x := now.Add(d); return &x }
	mint := func(ttl time.Duration) string {
		tok, err := Mint(priv, op, ttl, now)
		require.NoError(t, err)
		return tok
	}
	for name, tc := range map[string]struct {
		tok     string
		v       *Verifier
		wantErr error
	}{
		"24h is the default maximum":      {mint(DefaultMaxLifetime), v, nil},
		"one second longer":               {mint(DefaultMaxLifetime + time.Second), v, ErrLifetime},
		"a week":                          {mint(7 * 24 * time.Hour), v, ErrLifetime},
		"missing exp":                     {raw(at(0), at(0), nil), v, ErrClaims},
		"missing iat":                     {raw(nil, at(0), at(time.Hour)), v, ErrClaims},
		"missing nbf":                     {raw(at(0), nil, at(time.Hour)), v, ErrClaims},
		"iat in the future":               {raw(at(time.Hour), at(0), at(2*time.Hour)), v, ErrNotYetValid},
		"short iat-exp but far exp":       {raw(at(0), at(0), at(48*time.Hour)), v, ErrLifetime},
		"configured maximum":              {mint(2 * time.Hour), &Verifier{Key: pub, ClusterID: "c1", MaxLifetime: time.Hour, Now: v.Now}, ErrLifetime},
		"within the configured maximum":   {mint(time.Hour), &Verifier{Key: pub, ClusterID: "c1", MaxLifetime: time.Hour, Now: v.Now}, nil},
		"old iat, remaining life is fine": {raw(at(-20*time.Hour), at(-20*time.Hour), at(time.Hour)), v, nil},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := tc.v.Verify(tc.tok, KindOperator)
			if tc.wantErr == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.wantErr)
		})
	}
}

func TestVerifyAcceptsAnyWantedKind(t *testing.T) {
	pub, priv := keys(t)
	v := &Verifier{Key: pub, ClusterID: "c1"}
	adm := Claims{Kind: KindAdmin, ClusterID: "c1", Tenant: "default", RegisteredClaims: jwt.RegisteredClaims{Subject: "adm"}}
	tok, err := Mint(priv, adm, time.Hour, time.Now())
	require.NoError(t, err)
	c, err := v.Verify(tok, KindOperator, KindAdmin)
	require.NoError(t, err)
	require.Equal(t, KindAdmin, c.Kind)
	_, err = v.Verify(tok, KindOperator)
	require.ErrorIs(t, err, ErrWrongKind)
	require.Equal(t, "cluster/nonces/"+c.ID, (&Ledger{Keys: layout.New("")}).MarkerKey(c), "admin nonces are cluster-wide")
}

func TestMintRejectsBadClaims(t *testing.T) {
	_, priv := keys(t)
	for name, c := range map[string]Claims{
		"no kind":        {ClusterID: "c", Tenant: "t", RegisteredClaims: jwt.RegisteredClaims{Subject: "s"}},
		"agent no shard": {Kind: KindAgent, ClusterID: "c", Tenant: "t", RegisteredClaims: jwt.RegisteredClaims{Subject: "s"}},
		"bad tenant":     {Kind: KindOperator, ClusterID: "c", Tenant: "../t", RegisteredClaims: jwt.RegisteredClaims{Subject: "s"}},
		"no cluster":     {Kind: KindOperator, Tenant: "t", RegisteredClaims: jwt.RegisteredClaims{Subject: "s"}},
	} {
		_, err := Mint(priv, c, time.Hour, time.Now())
		require.ErrorIs(t, err, ErrClaims, name)
	}
	_, err := Mint(priv, Claims{Kind: KindOperator, ClusterID: "c", Tenant: "t", RegisteredClaims: jwt.RegisteredClaims{Subject: "s"}}, 0, time.Now())
	require.Error(t, err)
}

func TestLedgerSingleUse(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New()
	l1 := &Ledger{Store: mem, Keys: layout.New("")}
	l2 := &Ledger{Store: mem, Keys: layout.New("")}
	op := &Claims{Kind: KindOperator, ClusterID: "c", Tenant: "t", RegisteredClaims: jwt.RegisteredClaims{ID: "j1", Subject: "op"}}
	ag := &Claims{Kind: KindAgent, ClusterID: "c", Tenant: "t", Shard: "s1", RegisteredClaims: jwt.RegisteredClaims{ID: "j1", Subject: "i"}}
	require.Equal(t, "cluster/nonces/j1", l1.MarkerKey(op))
	require.Equal(t, "shard/s1/nonces/j1", l1.MarkerKey(ag))
	use := func(key, cert, by string) Use {
		return Use{KeySHA256: key, CertificatePEM: cert, UsedBy: by, Now: time.Now()}
	}
	m, err := l1.Consume(ctx, op, use("k1", "cert-1", "srv1"))
	require.NoError(t, err)
	require.Equal(t, "cert-1", m.CertificatePEM)
	// Another key: replayed, on any server.
	_, err = l2.Consume(ctx, op, use("k2", "cert-2", "srv2"))
	require.ErrorIs(t, err, ErrReplayed)
	// The same key again (a retry after a lost reply): the stored certificate.
	m, err = l2.Consume(ctx, op, use("k1", "cert-1b", "srv2"))
	require.NoError(t, err)
	require.Equal(t, "cert-1", m.CertificatePEM)
	require.Equal(t, "srv1", m.UsedBy)
	_, err = l1.Consume(ctx, op, Use{Now: time.Now()})
	require.Error(t, err, "a use without a key fingerprint is refused")
	// Agent markers are per shard.
	_, err = l2.Consume(ctx, ag, use("k2", "c", "srv2"))
	require.NoError(t, err)
	_, err = l1.Consume(ctx, ag, use("k3", "c", "srv1"))
	require.ErrorIs(t, err, ErrReplayed)
	// A marker written without a key (older format, or foreign) never matches.
	_, err = mem.Put(ctx, "shard/s1/nonces/j2", []byte(`{"jti":"j2","sub":"i"}`), objstore.PutOptions{})
	require.NoError(t, err)
	ag2 := *ag
	ag2.ID = "j2"
	_, err = l1.Consume(ctx, &ag2, use("", "c", "srv1"))
	require.Error(t, err)
	_, err = l1.Consume(ctx, &ag2, use("k1", "c", "srv1"))
	require.ErrorIs(t, err, ErrReplayed)
}

func TestKeyFingerprint(t *testing.T) {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	a, err := KeyFingerprint(pub)
	require.NoError(t, err)
	require.Len(t, a, 64)
	b, err := KeyFingerprint(pub)
	require.NoError(t, err)
	require.Equal(t, a, b)
	other, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	c, err := KeyFingerprint(other)
	require.NoError(t, err)
	require.NotEqual(t, a, c)
}

// putMarker writes a marker whose nonce expires at exp (zero: a marker of
// an older version without an expiry).
func putMarker(t *testing.T, mem objstore.Store, key string, exp time.Time) {
	t.Helper()
	body := []byte(`{"jti":"x"}`)
	if !exp.IsZero() {
		var err error
		body, err = json.Marshal(Marker{JTI: "x", ExpiresAt: exp})
		require.NoError(t, err)
	}
	_, err := mem.Put(context.Background(), key, body, objstore.PutOptions{})
	require.NoError(t, err)
}

// TestSweepHonoursEachMarkersExpiry: a marker goes once its own nonce has
// expired (plus the grace), however long ago it was written and whatever
// lifetime the sweeping server accepts; at most limit per pass; another
// prefix is not touched (finding 8 of the trust review).
func TestSweepHonoursEachMarkersExpiry(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New()
	keys := layout.New("")
	written := time.Now()
	for i := range 4 {
		putMarker(t, mem, keys.ClusterNonce(fmt.Sprintf("short-%d", i)), written.Add(time.Hour))
	}
	// Minted for 20 days by a shard that accepts that long.
	putMarker(t, mem, keys.ClusterNonce("long"), written.Add(20*24*time.Hour))
	putMarker(t, mem, keys.ShardNonce("s1", "agent"), written.Add(time.Minute))
	w := &Sweeper{Store: mem, Grace: 5 * time.Minute, LegacyKeep: 30 * 24 * time.Hour}
	prefix := keys.ClusterNonce("")

	st, err := w.Sweep(ctx, prefix, written.Add(time.Minute), 0)
	require.NoError(t, err)
	require.Equal(t, SweepStats{Listed: 5}, st, "written within the grace: not even read")
	st, err = w.Sweep(ctx, prefix, written.Add(time.Hour+4*time.Minute), 0)
	require.NoError(t, err)
	require.Equal(t, SweepStats{Listed: 5, Kept: 5}, st, "expired, but within the grace")

	// Two hours later: a sweeper whose own lifetime is 1h (what the cluster
	// leader used before) would delete them all; the long nonce's stays.
	later := written.Add(2 * time.Hour)
	st, err = w.Sweep(ctx, prefix, later, 3)
	require.NoError(t, err)
	require.Equal(t, SweepStats{Listed: 5, Deleted: 3, Kept: 1, More: true}, st)
	st, err = w.Sweep(ctx, prefix, later, 3)
	require.NoError(t, err)
	require.Equal(t, SweepStats{Listed: 2, Deleted: 1, Kept: 1}, st)
	_, err = mem.Head(ctx, keys.ClusterNonce("long"))
	require.NoError(t, err, "the 20-day nonce can still verify on its shard")
	_, err = mem.Head(ctx, keys.ShardNonce("s1", "agent"))
	require.NoError(t, err, "another prefix is not touched")

	st, err = w.Sweep(ctx, prefix, written.Add(20*24*time.Hour+6*time.Minute), 0)
	require.NoError(t, err)
	require.Equal(t, SweepStats{Listed: 1, Deleted: 1}, st, "gone once it expired")
}

// TestSweepKeepsMarkersWithoutExpiry: markers of older versions carry no
// expiry (or cannot be read): they are kept until the longest lifetime any
// configuration allows has passed since they were written, then swept
// (a clock 29 and 31 days later).
func TestSweepKeepsMarkersWithoutExpiry(t *testing.T) {
	ctx := context.Background()
	mem := memstore.New()
	keys := layout.New("p")
	written := time.Now()
	putMarker(t, mem, keys.ShardNonce("s1", "legacy"), time.Time{})
	_, err := mem.Put(ctx, keys.ShardNonce("s1", "junk"), []byte("not json"), objstore.PutOptions{})
	require.NoError(t, err)
	var logged []string
	w := &Sweeper{Store: mem, Grace: 5 * time.Minute, LegacyKeep: 30 * 24 * time.Hour,
		Log: func(key string, err error) { logged = append(logged, key) }}
	prefix := keys.ShardNonce("s1", "")
	st, err := w.Sweep(ctx, prefix, written.Add(29*24*time.Hour), 0)
	require.NoError(t, err)
	require.Equal(t, SweepStats{Listed: 2, Kept: 2}, st)
	require.Equal(t, []string{keys.ShardNonce("s1", "junk")}, logged)
	st, err = w.Sweep(ctx, prefix, written.Add(29*24*time.Hour+time.Hour), 0)
	require.NoError(t, err)
	require.Equal(t, SweepStats{Listed: 2, Kept: 2}, st)
	require.Len(t, logged, 1, "a marker version is read once")
	st, err = w.Sweep(ctx, prefix, written.Add(31*24*time.Hour), 0)
	require.NoError(t, err)
	require.Equal(t, SweepStats{Listed: 2, Deleted: 2}, st)
}

// countingStore counts Gets.
type countingStore struct {
	objstore.Store
	gets int
}

func (s *countingStore) Get(ctx context.Context, key string) (*objstore.Object, error) {
	s.gets++
	return s.Store.Get(ctx, key)
}

// TestSweepReadsEachMarkerVersionOnce: a kept marker is not read again at
// the next pass; a rewritten one is.
func TestSweepReadsEachMarkerVersionOnce(t *testing.T) {
	ctx := context.Background()
	mem := &countingStore{Store: memstore.New()}
	keys := layout.New("")
	written := time.Now()
	putMarker(t, mem, keys.ClusterNonce("a"), written.Add(24*time.Hour))
	w := &Sweeper{Store: mem, Grace: time.Minute, LegacyKeep: time.Hour}
	for i := range 3 {
		_, err := w.Sweep(ctx, keys.ClusterNonce(""), written.Add(time.Duration(i+1)*time.Hour), 0)
		require.NoError(t, err)
	}
	require.Equal(t, 1, mem.gets)
	putMarker(t, mem, keys.ClusterNonce("a"), written.Add(time.Hour))
	st, err := w.Sweep(ctx, keys.ClusterNonce(""), written.Add(5*time.Hour), 0)
	require.NoError(t, err)
	require.Equal(t, 1, st.Deleted, "the new version is read (mem dates it now: %v)", st)
}
