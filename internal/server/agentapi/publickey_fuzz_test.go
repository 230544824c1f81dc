package agentapi

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"testing"
	"time"

	"github.com/nstance-dev/nstance/internal/keytype"
	"github.com/nstance-dev/nstance/internal/pki"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// FuzzParsePublicKey feeds arbitrary strings to parsePublicKey and
// keytype.Of, the path of every public key an agent submits (SubmitKeys:
// template keys and identity renewal). It must never panic. A key accepted
// with a KeyType the API names must be exactly that kind of key, encode back
// to the same key, and be certifiable: a CA can sign a certificate for it
// that carries the same key. Text after the PEM block is refused.
func FuzzParsePublicKey(f *testing.F) {
	for _, pub := range []any{
		ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, 32)).Public(),
		mustEC(f, elliptic.P256()), mustEC(f, elliptic.P384()), mustEC(f, elliptic.P521()),
	} {
		p, err := pki.MarshalPublicKeyPEM(pub)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(p))
		f.Add(string(p) + "\n\n")
		f.Add(string(p) + "x")
	}
	f.Add("")
	f.Add("-----BEGIN PUBLIC KEY-----\n-----END PUBLIC KEY-----\n")
	f.Add("-----BEGIN CERTIFICATE-----\nMCowBQYDK2VwAyEAAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=\n-----END CERTIFICATE-----\n")

	caPub, caKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fuzz CA"}, NotBefore: now, NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, caPub, caKey)
	if err != nil {
		f.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		f.Fatal(err)
	}

	f.Fuzz(func(t *testing.T, s string) {
		pub, err := parsePublicKey(s)
		if err != nil {
			return
		}
		if b, rest := pem.Decode([]byte(s)); b == nil || len(bytes.TrimSpace(rest)) != 0 {
			t.Fatalf("accepted %q: not exactly one PEM block", s)
		}
		kt := keytype.Of(pub)
		switch k := pub.(type) {
		case ed25519.PublicKey:
			if kt != nstancev1.KeyType_KEY_TYPE_ED25519 || len(k) != ed25519.PublicKeySize {
				t.Fatalf("Ed25519 key of %d bytes typed %s", len(k), kt)
			}
		case *ecdsa.PublicKey:
			want := map[string]nstancev1.KeyType{"P-256": nstancev1.KeyType_KEY_TYPE_ECDSA_P256, "P-384": nstancev1.KeyType_KEY_TYPE_ECDSA_P384}[k.Curve.Params().Name]
			if kt != want {
				t.Fatalf("ECDSA %s key typed %s", k.Curve.Params().Name, kt)
			}
		case *rsa.PublicKey:
			want := map[int]nstancev1.KeyType{2048: nstancev1.KeyType_KEY_TYPE_RSA_2048, 4096: nstancev1.KeyType_KEY_TYPE_RSA_4096}[k.N.BitLen()]
			if kt != want {
				t.Fatalf("RSA key of %d bits typed %s", k.N.BitLen(), kt)
			}
		default:
			if kt != nstancev1.KeyType_KEY_TYPE_UNSPECIFIED {
				t.Fatalf("key %T typed %s", pub, kt)
			}
		}
		if kt == nstancev1.KeyType_KEY_TYPE_UNSPECIFIED {
			return // refused by SubmitKeys: no requested type matches
		}
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			t.Fatalf("accepted %s key does not encode: %v", kt, err)
		}
		again, err := x509.ParsePKIXPublicKey(der)
		if err != nil || !pub.(interface{ Equal(crypto.PublicKey) bool }).Equal(again) {
			t.Fatalf("accepted %s key changes in an encode/parse round trip (%v)", kt, err)
		}
		leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "key"}, NotBefore: now, NotAfter: now.Add(time.Hour)}
		certDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, pub, caKey)
		if err != nil {
			t.Fatalf("accepted %s key cannot be certified: %v", kt, err)
		}
		cert, err := x509.ParseCertificate(certDER)
		if err != nil || !pub.(interface{ Equal(crypto.PublicKey) bool }).Equal(cert.PublicKey) {
			t.Fatalf("certificate for an accepted %s key carries another key (%v)", kt, err)
		}
	})
}

func mustEC(f *testing.F, c elliptic.Curve) any {
	k, err := ecdsa.GenerateKey(c, rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	return k.Public()
}
