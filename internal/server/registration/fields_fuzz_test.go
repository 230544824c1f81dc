package registration

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nstance-dev/nstance/internal/pki"
)

// FuzzRegistrationFields feeds arbitrary registration requests (nonce,
// public key PEM, IP addresses, host name; the client-supplied fields of
// RegisterAgent and RegisterOperator) to checkFields and what follows it.
// It must never panic. A request it accepts carries an Ed25519 key, and an
// operator certificate is issued for it naming exactly that key, those
// addresses and that host name; renewal (Issuer.Renew with a new key PEM)
// accepts exactly the keys registration accepts and certifies the same key.
func FuzzRegistrationFields(f *testing.F) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	ca, err := pki.GenerateCA("c1", 24*time.Hour, now)
	if err != nil {
		f.Fatal(err)
	}
	issuer := &Issuer{CA: ca, ClusterID: "c1", AgentValidity: time.Hour, OperatorValidity: time.Hour, Now: func() time.Time { return now }}
	edPEM, err := pki.MarshalPublicKeyPEM(ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, 32)).Public())
	if err != nil {
		f.Fatal(err)
	}
	ecPEM := "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEEVs/o5+uQbTjL3chynL4wXgUg2R9\nq9UU8I5mEovUf86QZ7kOBIjJwqnzD1omageEHWwHdBO6B+dFabmdT9POxg==\n-----END PUBLIC KEY-----\n"
	f.Add("tok", string(edPEM), "10.0.0.1,fd00::1", "node-1.example.com")
	f.Add("tok", string(edPEM), "", "")
	f.Add("tok", string(edPEM)+string(edPEM), "::ffff:10.0.0.1", "a")
	f.Add("tok", ecPEM, "10.0.0.1", "x")
	f.Add("tok", strings.Replace(string(edPEM), "PUBLIC KEY", "PRIVATE KEY", 2), "", "")
	f.Add("tok", "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA\n-----END PUBLIC KEY-----\n", "", "")
	f.Add("", string(edPEM), "", "")
	f.Add("tok", string(edPEM), "10.0.0.1,not-an-ip", "-bad-")

	f.Fuzz(func(t *testing.T, nonceTok, keyPEM, ipList, hostname string) {
		var ips []string
		if ipList != "" {
			ips = strings.Split(ipList, ",")
		}
		fields, err := checkFields(nonceTok, keyPEM, ips, hostname)
		_, renewErr := issuer.Renew(pki.Identity{ClusterID: "c1", Tenant: "t", Role: pki.RoleOperator, ClientID: "op"}, nil, keyPEM)
		if err != nil {
			if keyPEM != "" && len(keyPEM) <= maxKeyPEMLen && renewErr == nil {
				if _, perr := pki.ParseEd25519PublicKeyPEM([]byte(keyPEM)); perr != nil {
					t.Fatalf("renewal accepted a key registration refuses: %v", perr)
				}
			}
			return
		}
		pub, ok := fields.pub.(ed25519.PublicKey)
		if !ok || len(pub) != ed25519.PublicKeySize {
			t.Fatalf("accepted a key of type %T (%d bytes)", fields.pub, len(pub))
		}
		if renewErr != nil {
			t.Fatalf("registration accepted a key renewal refuses: %v", renewErr)
		}
		var dns []string
		if fields.hostname != "" {
			dns = []string{fields.hostname}
		}
		id := pki.Identity{ClusterID: "c1", Tenant: "t", Role: pki.RoleOperator, ClientID: "op"}
		issued, err := issuer.Issue(id, fields.pub, fields.ips, dns)
		if err != nil {
			t.Fatalf("accepted fields cannot be issued a certificate: %v", err)
		}
		cert, err := pki.ParseCertificatePEM([]byte(issued.CertificatePEM))
		if err != nil {
			t.Fatalf("issued certificate does not parse: %v", err)
		}
		if got, ok := cert.PublicKey.(ed25519.PublicKey); !ok || !got.Equal(pub) {
			t.Fatalf("certificate key %T differs from the submitted key", cert.PublicKey)
		}
		if len(cert.IPAddresses) != len(fields.ips) {
			t.Fatalf("certificate names %d addresses, %d submitted", len(cert.IPAddresses), len(fields.ips))
		}
		for i, ip := range fields.ips {
			if !cert.IPAddresses[i].Equal(ip) {
				t.Fatalf("certificate address %d is %s, submitted %s", i, cert.IPAddresses[i], ip)
			}
			if net.ParseIP(ips[i]) == nil {
				t.Fatalf("accepted address %q", ips[i])
			}
		}
		if strings.Join(cert.DNSNames, ",") != strings.Join(dns, ",") {
			t.Fatalf("certificate names %q, submitted %q", cert.DNSNames, dns)
		}
		got, err := pki.IdentityFromCert(cert, "c1")
		if err != nil || got != id {
			t.Fatalf("certificate identity %+v (%v), want %+v", got, err, id)
		}
		if _, err := cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Fatalf("issued certificate does not verify against the CA: %v", err)
		}
	})
}
