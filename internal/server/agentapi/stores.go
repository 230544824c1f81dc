package agentapi

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"sync"
	"time"

	"github.com/nstance-dev/nstance/internal/pki"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// MemKeyStore is an in-memory KeyStore. Losing it is harmless: agents submit
// all their public keys again on every connection and certificates are
// re-issued.
type MemKeyStore struct {
	mu   sync.Mutex
	keys map[string]map[string]StoredKey
}

// NewMemKeyStore returns an empty store.
func NewMemKeyStore() *MemKeyStore { return &MemKeyStore{keys: map[string]map[string]StoredKey{}} }

// PutKey implements KeyStore. Submitting the same public key again keeps its certificate.
func (m *MemKeyStore) PutKey(_ context.Context, ref Ref, name string, k StoredKey) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	inst := m.keys[ref.InstanceID]
	if inst == nil {
		inst = map[string]StoredKey{}
		m.keys[ref.InstanceID] = inst
	}
	if old, ok := inst[name]; ok && old.PublicKeyPEM == k.PublicKeyPEM && old.Type == k.Type {
		return nil
	}
	inst[name] = StoredKey{Type: k.Type, PublicKeyPEM: k.PublicKeyPEM}
	return nil
}

// PutCertificate implements KeyStore.
func (m *MemKeyStore) PutCertificate(_ context.Context, ref Ref, name, pubPEM string, certPEM []byte, specHash string, nb, na time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k, ok := m.keys[ref.InstanceID][name]
	if !ok || k.PublicKeyPEM != pubPEM {
		return false, nil
	}
	k.CertPEM, k.CertSpecHash, k.NotBefore, k.NotAfter = append([]byte(nil), certPEM...), specHash, nb, na
	m.keys[ref.InstanceID][name] = k
	return true, nil
}

// Keys implements KeyStore.
func (m *MemKeyStore) Keys(_ context.Context, ref Ref) (map[string]StoredKey, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]StoredKey, len(m.keys[ref.InstanceID]))
	for n, k := range m.keys[ref.InstanceID] {
		out[n] = k
	}
	return out, nil
}

// Forget drops everything stored for an instance (call on deletion).
func (m *MemKeyStore) Forget(instanceID string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.keys, instanceID)
}

// CASigner issues certificates with the cluster CA.
type CASigner struct {
	CA *pki.CA
	// MaxValidity caps (and, when a spec sets none, is) the lifetime.
	MaxValidity time.Duration
	Now         func() time.Time
}

// Sign implements Signer.
func (c *CASigner) Sign(_ context.Context, ref Ref, spec *nstancev1.CertificateSpec, pub crypto.PublicKey) ([]byte, time.Time, time.Time, error) {
	if c.CA == nil || c.MaxValidity <= 0 {
		return nil, time.Time{}, time.Time{}, errors.New("signer: CA and maximum validity are required")
	}
	now := time.Now()
	if c.Now != nil {
		now = c.Now()
	}
	validity := c.MaxValidity
	if d := spec.GetValidity().AsDuration(); spec.GetValidity() != nil && d > 0 && d < validity {
		validity = d
	}
	sn, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, time.Time{}, time.Time{}, fmt.Errorf("serial: %w", err)
	}
	cn := spec.GetCommonName()
	if cn == "" {
		cn = ref.InstanceID
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn.Add(sn, big.NewInt(1)),
		Subject:      pkix.Name{CommonName: cn, Organization: []string{ref.Tenant}},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		DNSNames:     spec.GetDnsNames(),
	}
	if tmpl.NotAfter.After(c.CA.Cert.NotAfter) {
		tmpl.NotAfter = c.CA.Cert.NotAfter
	}
	if _, ok := pub.(*rsa.PublicKey); ok { // RSA keys may also encipher
		tmpl.KeyUsage |= x509.KeyUsageKeyEncipherment
	}
	for _, u := range spec.GetUsages() {
		switch u {
		case nstancev1.CertificateUsage_CERTIFICATE_USAGE_SERVER_AUTH:
			tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
		case nstancev1.CertificateUsage_CERTIFICATE_USAGE_CLIENT_AUTH:
			tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
		default:
			return nil, time.Time{}, time.Time{}, fmt.Errorf("signer: unsupported usage %s", u)
		}
	}
	for _, s := range spec.GetIpAddresses() {
		ip := net.ParseIP(s)
		if ip == nil {
			return nil, time.Time{}, time.Time{}, fmt.Errorf("signer: %q is not an IP address", s)
		}
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
	}
	for _, s := range spec.GetUris() {
		u, err := url.Parse(s)
		if err != nil || u.Scheme == "" {
			return nil, time.Time{}, time.Time{}, fmt.Errorf("signer: %q is not an absolute URI", s)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.CA.Cert, pub, c.CA.Key)
	if err != nil {
		return nil, time.Time{}, time.Time{}, fmt.Errorf("signer: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), tmpl.NotBefore, tmpl.NotAfter, nil
}
