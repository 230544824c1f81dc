package nonce

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// fuzzNow is the fixed clock of the nonce fuzz targets, so the seed tokens
// stay valid in every run.
var fuzzNow = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// fuzzKey is the cluster nonce key of the fuzz targets (a fixed seed: the
// seed tokens are minted with it); fuzzForeignKey is anyone else's.
func fuzzKey() ed25519.PrivateKey {
	return ed25519.NewKeyFromSeed([]byte("nstance-fuzz-nonce-key-seed-0001"))
}

func fuzzForeignKey() ed25519.PrivateKey {
	return ed25519.NewKeyFromSeed([]byte("nstance-fuzz-some-other-key-0002"))
}

func fuzzVerifier() *Verifier {
	return &Verifier{Key: fuzzKey().Public().(ed25519.PublicKey), ClusterID: "c1", Shard: "s1", Leeway: 5 * time.Second,
		Now: func() time.Time { return fuzzNow }}
}

// fuzzSeedClaims are the claims the seed tokens are minted from.
func fuzzSeedClaims() []Claims {
	return []Claims{
		{Kind: KindAgent, ClusterID: "c1", Tenant: "acme", Shard: "s1", Group: "web", RegisteredClaims: jwt.RegisteredClaims{Subject: "i-1", ID: "jti-agent"}},
		{Kind: KindOperator, ClusterID: "c1", Tenant: "default", RegisteredClaims: jwt.RegisteredClaims{Subject: "op", ID: "jti-operator"}},
		{Kind: KindAdmin, ClusterID: "c1", Tenant: "default", RegisteredClaims: jwt.RegisteredClaims{Subject: "admin", ID: "jti-admin"}},
	}
}

// FuzzVerify hands arbitrary token strings to Verify with the real cluster
// key. It must never panic, and it may accept only a token whose signing
// input (header.payload) the key holder signed, here: one of the minted seed
// tokens. An accepted token's signature must verify on its own with
// ed25519, its header must name EdDSA, and the claims returned must be the
// payload's.
func FuzzVerify(f *testing.F) {
	key, foreign := fuzzKey(), fuzzForeignKey()
	pub := key.Public().(ed25519.PublicKey)
	signed := map[string]bool{}
	for _, c := range fuzzSeedClaims() {
		tok, err := Mint(key, c, time.Hour, fuzzNow)
		if err != nil {
			f.Fatal(err)
		}
		signed[tok[:strings.LastIndexByte(tok, '.')]] = true
		f.Add(tok)
		other, err := Mint(foreign, c, time.Hour, fuzzNow)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(other)
		// The same claims under other algorithms: none, and HMAC keyed
		// with the public key (algorithm confusion).
		c.IssuedAt, c.NotBefore, c.ExpiresAt = jwt.NewNumericDate(fuzzNow), jwt.NewNumericDate(fuzzNow), jwt.NewNumericDate(fuzzNow.Add(time.Hour))
		if none, err := jwt.NewWithClaims(jwt.SigningMethodNone, c).SignedString(jwt.UnsafeAllowNoneSignatureType); err == nil {
			f.Add(none)
		}
		if hs, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString([]byte(pub)); err == nil {
			f.Add(hs)
		}
	}
	f.Add("")
	f.Add("a.b.c")
	f.Add("eyJhbGciOiJFZERTQSIsInR5cCI6IkpXVCJ9..")
	f.Add("eyJhbGciOiJFZERTQSIsInR5cCI6IkpXVCJ9.e30.AAAA")

	v := fuzzVerifier()
	f.Fuzz(func(t *testing.T, token string) {
		c, err := v.Verify(token, KindAgent, KindOperator, KindAdmin)
		if (c == nil) == (err == nil) {
			t.Fatalf("Verify returned claims %v and error %v: want exactly one", c != nil, err)
		}
		if err != nil {
			return
		}
		parts := strings.Split(token, ".")
		if len(parts) != 3 {
			t.Fatalf("accepted a token of %d parts", len(parts))
		}
		input := parts[0] + "." + parts[1]
		if !signed[input] {
			t.Fatalf("accepted a token the key holder never signed: %q", token)
		}
		sig, err := base64.RawURLEncoding.DecodeString(parts[2])
		if err != nil || !ed25519.Verify(pub, []byte(input), sig) {
			t.Fatalf("accepted a token whose signature does not verify with ed25519: %q", token)
		}
		var header map[string]any
		if b, err := base64.RawURLEncoding.DecodeString(parts[0]); err != nil || json.Unmarshal(b, &header) != nil || header["alg"] != "EdDSA" {
			t.Fatalf("accepted a token whose header is not EdDSA: %q", token)
		}
		var payload Claims
		if b, err := base64.RawURLEncoding.DecodeString(parts[1]); err != nil || json.Unmarshal(b, &payload) != nil {
			t.Fatalf("accepted a token whose payload does not decode: %q", token)
		}
		if payload.ID != c.ID || payload.Subject != c.Subject || payload.Kind != c.Kind || payload.Tenant != c.Tenant || payload.Shard != c.Shard {
			t.Fatalf("claims %+v differ from the payload %+v", c, payload)
		}
	})
}

// FuzzMintVerify mints nonces from arbitrary claims. Whatever Mint signs
// with the cluster key must verify (for the cluster and shard it names)
// with the same claims, unless its lifetime is over the limit; the same
// claims signed with any other key, or with HMAC keyed by the public key,
// must be refused as such.
func FuzzMintVerify(f *testing.F) {
	for _, c := range fuzzSeedClaims() {
		f.Add(string(c.Kind), c.ClusterID, c.Tenant, c.Shard, c.Group, c.Subject, c.ID, int64(3600))
	}
	f.Add("agent", "c1", "acme", "s1", "", "i-0123456789abcdef0", "", int64(1))
	f.Add("operator", "prod-cluster", "t.e_n-ant", "", "", "op", "0123456789abcdef0123456789abcdef", int64(86400))
	f.Add("operator", "c1", "default", "", "", "op", "", int64(86401))
	f.Add("agent", "c1", "acme", "", "g", "i-1", "", int64(60))
	f.Add("root", "c1", "acme", "s1", "g", "i-1", "", int64(60))

	key, foreign := fuzzKey(), fuzzForeignKey()
	pub := key.Public().(ed25519.PublicKey)
	f.Fuzz(func(t *testing.T, kind, cluster, tenant, shard, group, subject, jti string, ttlSeconds int64) {
		if ttlSeconds < -1 || ttlSeconds > 3*86400 {
			ttlSeconds %= 3 * 86400
		}
		ttl := time.Duration(ttlSeconds) * time.Second
		c := Claims{Kind: Kind(kind), ClusterID: cluster, Tenant: tenant, Shard: shard, Group: group,
			RegisteredClaims: jwt.RegisteredClaims{Subject: subject, ID: jti}}
		tok, err := Mint(key, c, ttl, fuzzNow)
		if err != nil {
			return
		}
		v := &Verifier{Key: pub, ClusterID: cluster, Shard: shard, Now: func() time.Time { return fuzzNow }}
		got, err := v.Verify(tok, Kind(kind))
		if ttl > DefaultMaxLifetime {
			if !errors.Is(err, ErrLifetime) {
				t.Fatalf("a nonce minted for %s: want ErrLifetime, got %v", ttl, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("a nonce Mint signed does not verify: %v (claims %+v)", err, c)
		}
		if got.Kind != c.Kind || got.ClusterID != c.ClusterID || got.Tenant != c.Tenant || got.Shard != c.Shard ||
			got.Group != c.Group || got.Subject != c.Subject || (jti != "" && got.ID != jti) {
			t.Fatalf("claims changed between Mint and Verify: minted %+v, verified %+v", c, got)
		}

		forged, err := Mint(foreign, c, ttl, fuzzNow)
		if err != nil {
			t.Fatalf("minting with another key: %v", err)
		}
		if _, err := v.Verify(forged, Kind(kind)); !errors.Is(err, ErrSignature) {
			t.Fatalf("a nonce signed with another key: want ErrSignature, got %v", err)
		}
		hc := *got
		hs, err := jwt.NewWithClaims(jwt.SigningMethodHS256, hc).SignedString([]byte(pub))
		if err != nil {
			t.Fatalf("signing HS256: %v", err)
		}
		if _, err := v.Verify(hs, Kind(kind)); !errors.Is(err, ErrAlgorithm) {
			t.Fatalf("an HMAC nonce keyed with the public key: want ErrAlgorithm, got %v", err)
		}
	})
}

// TestMintRefusesClaimsVerifyWouldChange is the regression test of the
// FuzzMintVerify finding testdata/fuzz/FuzzMintVerify/bb0370b764895bd1: Mint
// signed a group (or cluster, or shard) that is not an ID, such as invalid
// UTF-8, which JSON encoding replaces, so the nonce verified with a
// different value than it was minted with.
func TestMintRefusesClaimsVerifyWouldChange(t *testing.T) {
	for name, c := range map[string]Claims{
		"group not UTF-8":   {Kind: KindAdmin, ClusterID: "c1", Tenant: "t", Group: "\x80", RegisteredClaims: jwt.RegisteredClaims{Subject: "s"}},
		"cluster not UTF-8": {Kind: KindOperator, ClusterID: "c\xff", Tenant: "t", RegisteredClaims: jwt.RegisteredClaims{Subject: "s"}},
		"cluster not an ID": {Kind: KindOperator, ClusterID: "a/b", Tenant: "t", RegisteredClaims: jwt.RegisteredClaims{Subject: "s"}},
		"shard not an ID":   {Kind: KindOperator, ClusterID: "c1", Shard: "../s", Tenant: "t", RegisteredClaims: jwt.RegisteredClaims{Subject: "s"}},
	} {
		_, err := Mint(fuzzKey(), c, time.Hour, fuzzNow)
		if !errors.Is(err, ErrClaims) {
			t.Errorf("%s: want ErrClaims, got %v", name, err)
		}
	}
}
