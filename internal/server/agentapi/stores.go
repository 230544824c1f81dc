package agentapi

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
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

// Len is the number of instances with stored keys.
func (m *MemKeyStore) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.keys)
}

// Forget drops everything stored for an instance (call on deletion).
func (m *MemKeyStore) Forget(instanceID string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.keys, instanceID)
}

// WorkloadSigner issues the certificates templates ask for with the
// workload CA of the instance's tenant. Every certificate is checked against the workload policy (no URI in
// the cluster's trust domain, no server name or address) and carries exactly
// the usages its spec lists; a spec without usages is refused.
type WorkloadSigner struct {
	// CAs returns the workload CA of a tenant (each tenant has its own, so
	// no tenant obtains a certificate another tenant's instances trust).
	CAs func(ctx context.Context, tenant string) (*pki.CA, error)
	// CA is one workload CA for every tenant, used when CAs is nil (tests
	// and tools with a single tenant); the cluster CA is refused.
	CA *pki.CA
	// MaxValidity caps (and, when a spec sets none, is) the lifetime.
	MaxValidity time.Duration
	// Policy returns the names no workload certificate may carry, read at
	// every signing so a config change applies at once.
	Policy func() pki.WorkloadPolicy
	Now    func() time.Time
}

// Sign implements Signer.
func (c *WorkloadSigner) Sign(ctx context.Context, ref Ref, spec *nstancev1.CertificateSpec, pub crypto.PublicKey) ([]byte, time.Time, time.Time, error) {
	if (c.CA == nil && c.CAs == nil) || c.MaxValidity <= 0 || c.Policy == nil {
		return nil, time.Time{}, time.Time{}, errors.New("signer: workload CA, maximum validity and policy are required")
	}
	ca := c.CA
	if c.CAs != nil {
		if ref.Tenant == "" {
			return nil, time.Time{}, time.Time{}, fmt.Errorf("signer: instance %s has no tenant", ref.InstanceID)
		}
		var err error
		if ca, err = c.CAs(ctx, ref.Tenant); err != nil {
			return nil, time.Time{}, time.Time{}, fmt.Errorf("signer: instance %s: the workload CA of tenant %s: %w", ref.InstanceID, ref.Tenant, err)
		}
	}
	now := time.Now()
	if c.Now != nil {
		now = c.Now()
	}
	validity := c.MaxValidity
	if d := spec.GetValidity().AsDuration(); spec.GetValidity() != nil && d > 0 && d < validity {
		validity = d
	}
	cn := spec.GetCommonName()
	if cn == "" {
		cn = ref.InstanceID
	}
	if len(spec.GetUsages()) == 0 {
		return nil, time.Time{}, time.Time{}, errors.New("signer: the certificate spec lists no usages (server_auth and/or client_auth are required)")
	}
	req := pki.WorkloadRequest{CommonName: cn, Organization: ref.Tenant, DNSNames: spec.GetDnsNames(), PublicKey: pub, Validity: validity}
	for _, u := range spec.GetUsages() {
		switch u {
		case nstancev1.CertificateUsage_CERTIFICATE_USAGE_SERVER_AUTH:
			req.Usages = append(req.Usages, x509.ExtKeyUsageServerAuth)
		case nstancev1.CertificateUsage_CERTIFICATE_USAGE_CLIENT_AUTH:
			req.Usages = append(req.Usages, x509.ExtKeyUsageClientAuth)
		default:
			return nil, time.Time{}, time.Time{}, fmt.Errorf("signer: unsupported usage %s", u)
		}
	}
	for _, s := range spec.GetIpAddresses() {
		ip := net.ParseIP(s)
		if ip == nil {
			return nil, time.Time{}, time.Time{}, fmt.Errorf("signer: %q is not an IP address", s)
		}
		req.IPs = append(req.IPs, ip)
	}
	for _, s := range spec.GetUris() {
		u, err := url.Parse(s)
		if err != nil || u.Scheme == "" {
			return nil, time.Time{}, time.Time{}, fmt.Errorf("signer: %q is not an absolute URI", s)
		}
		req.URIs = append(req.URIs, u)
	}
	cert, certPEM, err := ca.IssueWorkload(req, c.Policy(), now)
	if err != nil {
		return nil, time.Time{}, time.Time{}, fmt.Errorf("signer: instance %s: %w", ref.InstanceID, err)
	}
	return certPEM, cert.NotBefore, cert.NotAfter, nil
}
