package importedca

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/pkg/objstore"
)

// ErrNotImported reports that no CA was imported under a name.
var ErrNotImported = errors.New("no CA imported under this name")

// Reserved names: Nstance's own CAs are named so in templates.
var reserved = map[string]bool{"workload": true, "cluster": true}

// ValidateName checks an imported CA's name (a storage key segment, and
// neither "workload" nor "cluster").
func ValidateName(name string) error {
	if err := layout.ValidateID("CA name", name); err != nil {
		return err
	}
	if reserved[strings.ToLower(name)] {
		return fmt.Errorf("CA name %q is reserved for Nstance's own CAs", name)
	}
	return nil
}

// Store reads and writes imported CAs.
type Store struct {
	Objects objstore.Store
	Keys    layout.Keys
	Secrets *secrets.Store
}

// Import validates certPEM and keyPEM as a CA that may be imported
// (pki.CheckImportable; the key in PKCS#8, PKCS#1 or SEC 1 form must match
// the certificate) and not the same key as any of own (Nstance's own CAs),
// then stores it under name: the key encrypted first, the certificate last,
// so a reader never sees a certificate without its key. An existing CA of
// that name is replaced only with replace.
func (s *Store) Import(ctx context.Context, name string, certPEM, keyPEM []byte, own []*pki.CA, replace bool, now time.Time) (*pki.CA, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	signer, err := pki.ParseImportedKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	pk8, err := pki.MarshalPrivateKeyPEM(signer)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	ca, err := pki.LoadCA(certPEM, pk8)
	if err != nil {
		return nil, err
	}
	if err := pki.CheckImportable(ca, now); err != nil {
		return nil, err
	}
	for _, o := range own {
		if o != nil && pki.SameKey(ca, o) {
			return nil, errors.New("this is one of Nstance's own CAs (cluster or workload CA): only a CA from elsewhere can be imported")
		}
	}
	if !replace {
		if _, err := s.Objects.Head(ctx, s.Keys.ImportedCACert(name)); err == nil {
			return nil, fmt.Errorf("a CA named %q is already imported (replace it explicitly)", name)
		} else if !errors.Is(err, objstore.ErrNotFound) {
			return nil, fmt.Errorf("checking for an imported CA %q: %w", name, err)
		}
	}
	if err := s.Secrets.Put(ctx, s.Keys.ImportedCAKey(name), pk8, objstore.PutOptions{}); err != nil {
		return nil, fmt.Errorf("storing the key of CA %q: %w", name, err)
	}
	if _, err := s.Objects.Put(ctx, s.Keys.ImportedCACert(name), ca.CertPEM, objstore.PutOptions{}); err != nil {
		return nil, fmt.Errorf("storing the certificate of CA %q: %w", name, err)
	}
	return ca, nil
}

// Create generates a new CA (ECDSA P-256, subject CN=name) and stores it
// under name as Import does, replacing whatever is there. It is for a
// cluster whose API server does not have a CA yet (the dev stack): the
// caller hands the certificate to the API server.
func (s *Store) Create(ctx context.Context, name string, validity time.Duration, now time.Time) (*pki.CA, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating the CA key: %w", err)
	}
	sn, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generating a serial number: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn.Add(sn, big.NewInt(1)), Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(validity),
		IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("self-signing the CA: %w", err)
	}
	keyPEM, err := pki.MarshalPrivateKeyPEM(key)
	if err != nil {
		return nil, err
	}
	return s.Import(ctx, name, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), keyPEM, nil, true, now)
}

// Load reads the CA imported under name with its key.
func (s *Store) Load(ctx context.Context, name string) (*pki.CA, error) {
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	certPEM, err := s.readCert(ctx, name)
	if err != nil {
		return nil, err
	}
	keyPEM, err := s.Secrets.Get(ctx, s.Keys.ImportedCAKey(name))
	if err != nil {
		return nil, fmt.Errorf("reading the key of CA %q: %w", name, err)
	}
	ca, err := pki.LoadCA(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("imported CA %q: %w", name, err)
	}
	return ca, nil
}

func (s *Store) readCert(ctx context.Context, name string) ([]byte, error) {
	obj, err := s.Objects.Get(ctx, s.Keys.ImportedCACert(name))
	if errors.Is(err, objstore.ErrNotFound) {
		return nil, fmt.Errorf("%w: %q (import it with nstance-admin cluster ca import)", ErrNotImported, name)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the certificate of CA %q: %w", name, err)
	}
	return obj.Body, nil
}

// Info describes one imported CA.
type Info struct {
	Name     string
	Subject  string
	NotAfter time.Time
	// SHA256 is the hex fingerprint of the certificate.
	SHA256 string
}

// List returns the imported CAs by name.
func (s *Store) List(ctx context.Context) ([]Info, error) {
	prefix := s.Keys.ImportedCAPrefix()
	objs, err := s.Objects.List(ctx, prefix)
	if err != nil {
		return nil, fmt.Errorf("listing imported CAs: %w", err)
	}
	var out []Info
	for _, o := range objs {
		name, ok := strings.CutSuffix(strings.TrimPrefix(o.Key, prefix), ".crt")
		if !ok || ValidateName(name) != nil {
			continue
		}
		certPEM, err := s.readCert(ctx, name)
		if err != nil {
			return nil, err
		}
		c, err := pki.ParseCertificatePEM(certPEM)
		if err != nil {
			return nil, fmt.Errorf("imported CA %q: %w", name, err)
		}
		out = append(out, Info{Name: name, Subject: c.Subject.String(), NotAfter: c.NotAfter, SHA256: pki.Fingerprint(c)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Delete removes an imported CA: the certificate first, so no reader finds
// a certificate whose key is gone.
func (s *Store) Delete(ctx context.Context, name string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	if err := s.Objects.Delete(ctx, s.Keys.ImportedCACert(name)); err != nil && !errors.Is(err, objstore.ErrNotFound) {
		return fmt.Errorf("deleting the certificate of CA %q: %w", name, err)
	}
	if err := s.Objects.Delete(ctx, s.Keys.ImportedCAKey(name)); err != nil && !errors.Is(err, objstore.ErrNotFound) {
		return fmt.Errorf("deleting the key of CA %q: %w", name, err)
	}
	return nil
}

// Cache serves Load through a short-lived cache, so signing many
// certificates reads storage once per TTL and an import, replacement or
// deletion applies within it.
type Cache struct {
	Store *Store
	// TTL is how long a loaded CA (or its absence) is reused (default 10s).
	TTL time.Duration
	Now func() time.Time

	mu      sync.Mutex
	entries map[string]cacheEntry
}

type cacheEntry struct {
	ca  *pki.CA
	err error
	at  time.Time
}

// Get returns the CA imported under name.
func (c *Cache) Get(ctx context.Context, name string) (*pki.CA, error) {
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	ttl := c.TTL
	if ttl <= 0 {
		ttl = 10 * time.Second
	}
	c.mu.Lock()
	e, ok := c.entries[name]
	c.mu.Unlock()
	if ok && now().Sub(e.at) < ttl {
		return e.ca, e.err
	}
	ca, err := c.Store.Load(ctx, name)
	if err != nil && !errors.Is(err, ErrNotImported) {
		// A storage failure is not remembered: the next call retries.
		return nil, err
	}
	c.mu.Lock()
	if c.entries == nil {
		c.entries = map[string]cacheEntry{}
	}
	c.entries[name] = cacheEntry{ca: ca, err: err, at: now()}
	c.mu.Unlock()
	return ca, err
}
