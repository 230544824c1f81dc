package identity

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nstance-dev/nstance/internal/atomicfile"
	"github.com/nstance-dev/nstance/internal/pki"
)

// File names inside the identity directory. NonceFile and CAFile match what
// the local providers write.
const (
	NonceFile   = "nonce.jwt"
	CAFile      = "ca.crt"
	KeyFile     = "agent.key"
	CertFile    = "agent.crt"
	CAChainFile = "ca-chain.crt"
	// NextKeyFile is the key generated for an identity renewal, and
	// NextCertFile its certificate while the pair is being swapped in.
	NextKeyFile  = "agent.key.next"
	NextCertFile = "agent.crt.next"
)

// ErrNotRegistered is returned when no usable certificate is stored.
var ErrNotRegistered = errors.New("agent is not registered")

// Dir is one identity directory.
type Dir struct {
	path string

	mu      sync.Mutex
	cached  *tls.Certificate
	certMod time.Time
}

// Open returns the identity directory at path, creating it (0700) if missing.
func Open(path string) (*Dir, error) {
	if path == "" {
		return nil, errors.New("identity: directory is required")
	}
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("identity: creating %s: %w", path, err)
	}
	d := &Dir{path: path}
	if err := d.finishRenewal(); err != nil {
		return nil, err
	}
	return d, nil
}

// Path returns the full path of a file in the directory.
func (d *Dir) Path(name string) string { return filepath.Join(d.path, name) }

// Nonce returns the registration nonce, or fs.ErrNotExist (wrapped) when it is gone.
func (d *Dir) Nonce() (string, error) {
	b, err := os.ReadFile(d.Path(NonceFile))
	if err != nil {
		return "", fmt.Errorf("identity: reading nonce: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("identity: nonce file %s is empty", d.Path(NonceFile))
	}
	return tok, nil
}

// RemoveNonce deletes the nonce (durably: the directory is synced); a
// missing nonce is not an error.
func (d *Dir) RemoveNonce() error {
	if err := atomicfile.RemovePath(d.Path(NonceFile)); err != nil {
		return fmt.Errorf("identity: removing nonce: %w", err)
	}
	return nil
}

// Key returns the agent's Ed25519 key, generating and storing it (0600) the
// first time.
func (d *Dir) Key() (ed25519.PrivateKey, error) { return d.loadOrCreateKey(KeyFile) }

func (d *Dir) loadOrCreateKey(name string) (ed25519.PrivateKey, error) {
	k, err := d.loadKey(name)
	if err == nil || !errors.Is(err, fs.ErrNotExist) {
		return k, err
	}
	_, k, err = ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("identity: generating key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("identity: encoding key: %w", err)
	}
	if err := atomicfile.WritePath(d.Path(name), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return nil, err
	}
	return k, nil
}

// loadKey reads a stored Ed25519 key; a missing file is fs.ErrNotExist (wrapped).
func (d *Dir) loadKey(name string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(d.Path(name))
	switch {
	case err == nil:
		blk, _ := pem.Decode(b)
		if blk == nil || blk.Type != "PRIVATE KEY" {
			return nil, fmt.Errorf("identity: %s holds no PRIVATE KEY block", d.Path(name))
		}
		k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("identity: parsing %s: %w", d.Path(name), err)
		}
		ek, ok := k.(ed25519.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("identity: %s is %T, want Ed25519", d.Path(name), k)
		}
		return ek, nil
	default:
		return nil, fmt.Errorf("identity: reading key: %w", err)
	}
}

// PublicKeyPEM returns the PKIX PEM of the agent key.
func (d *Dir) PublicKeyPEM() (string, error) {
	k, err := d.Key()
	if err != nil {
		return "", err
	}
	der, err := x509.MarshalPKIXPublicKey(k.Public())
	if err != nil {
		return "", fmt.Errorf("identity: encoding public key: %w", err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})), nil
}

// SaveCertificate checks that certPEM belongs to the agent key and stores it
// with the CA chain.
func (d *Dir) SaveCertificate(certPEM, chainPEM string) error {
	k, err := d.Key()
	if err != nil {
		return err
	}
	cert, err := parseCert([]byte(certPEM))
	if err != nil {
		return fmt.Errorf("identity: issued certificate: %w", err)
	}
	if !k.Public().(ed25519.PublicKey).Equal(cert.PublicKey) {
		return errors.New("identity: issued certificate does not match the agent key")
	}
	if chainPEM != "" {
		if _, err := parseCert([]byte(chainPEM)); err != nil {
			return fmt.Errorf("identity: CA chain: %w", err)
		}
		if err := atomicfile.WritePath(d.Path(CAChainFile), []byte(chainPEM), 0o644); err != nil {
			return err
		}
	}
	return atomicfile.WritePath(d.Path(CertFile), []byte(certPEM), 0o644)
}

// Certificate returns the stored client certificate with its key, or
// ErrNotRegistered when there is none (or it does not match the key).
func (d *Dir) Certificate(now time.Time) (*tls.Certificate, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	fi, err := os.Stat(d.Path(CertFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotRegistered
	}
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	if d.cached != nil && fi.ModTime().Equal(d.certMod) {
		return d.cached, nil
	}
	b, err := os.ReadFile(d.Path(CertFile))
	if err != nil {
		return nil, fmt.Errorf("identity: reading certificate: %w", err)
	}
	cert, err := parseCert(b)
	if err != nil {
		return nil, fmt.Errorf("identity: %s: %w", d.Path(CertFile), err)
	}
	k, err := d.Key()
	if err != nil {
		return nil, err
	}
	if !k.Public().(ed25519.PublicKey).Equal(cert.PublicKey) {
		return nil, fmt.Errorf("%w: %s does not match %s", ErrNotRegistered, CertFile, KeyFile)
	}
	if now.After(cert.NotAfter) {
		return nil, fmt.Errorf("%w: certificate expired at %s", ErrNotRegistered, cert.NotAfter.UTC().Format(time.RFC3339))
	}
	tc := &tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: crypto.Signer(k), Leaf: cert}
	d.cached, d.certMod = tc, fi.ModTime()
	return tc, nil
}

// Roots returns the CA pool used to verify servers: the provider's CA file
// plus the chain returned at registration.
func (d *Dir) Roots() (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	n := 0
	for _, name := range []string{CAFile, CAChainFile} {
		b, err := os.ReadFile(d.Path(name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("identity: reading %s: %w", name, err)
		}
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("identity: %s holds no usable certificate", d.Path(name))
		}
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("identity: no CA certificate in %s", d.path)
	}
	return pool, nil
}

// RegistrationTLS is the TLS configuration for the registration service:
// server verified against the CA and by its server identity, which must
// name the shard the nonce was minted for (once the nonce is spent: the
// shard of the agent's certificate); no client certificate.
func (d *Dir) RegistrationTLS(serverName string) (*tls.Config, error) {
	roots, err := d.Roots()
	if err != nil {
		return nil, err
	}
	var shard string
	tok, err := d.Nonce()
	switch {
	case err == nil:
		if shard, err = nonceShard(tok); err != nil {
			return nil, err
		}
	case errors.Is(err, fs.ErrNotExist):
		if shard, err = d.certShard(); err != nil {
			return nil, err
		}
	default:
		return nil, err
	}
	return pki.ClientTLSForShard(roots, nil, serverName, shard), nil
}

// certShard is the shard of the stored agent certificate.
func (d *Dir) certShard() (string, error) {
	c, err := d.Certificate(time.Now())
	if err != nil {
		return "", err
	}
	id, err := pki.IdentityFromCert(c.Leaf, "")
	if err != nil {
		return "", fmt.Errorf("identity: the agent certificate: %w", err)
	}
	return id.Shard, nil
}

// nonceShard reads the shard claim of a nonce without verifying it (the
// agent holds no key to verify it with; the server does that).
func nonceShard(tok string) (string, error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return "", errors.New("identity: the nonce is not a JWT")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", fmt.Errorf("identity: the nonce's claims: %w", err)
	}
	var claims struct {
		Shard string `json:"shard"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return "", fmt.Errorf("identity: the nonce's claims: %w", err)
	}
	if claims.Shard == "" {
		return "", errors.New("identity: the nonce names no shard")
	}
	return claims.Shard, nil
}

// AgentTLS is the mTLS configuration for the agent service: the server is
// verified as for RegistrationTLS and must serve the shard of the agent's
// certificate. The client certificate is re-read from disk on each
// handshake when it changed.
func (d *Dir) AgentTLS(serverName string) (*tls.Config, error) {
	roots, err := d.Roots()
	if err != nil {
		return nil, err
	}
	if _, err := d.Certificate(time.Now()); err != nil {
		return nil, err
	}
	cfg := pki.ClientTLS(roots, nil, serverName)
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return d.Certificate(time.Now())
	}
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		shard, err := d.certShard()
		if err != nil {
			return err
		}
		return pki.VerifyServerOfShard(shard)(cs)
	}
	return cfg, nil
}

func parseCert(b []byte) (*x509.Certificate, error) {
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return nil, errors.New("no CERTIFICATE PEM block")
	}
	return x509.ParseCertificate(blk.Bytes)
}
