package pki

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"sync"
)

// Fingerprint is the hex SHA-256 of a certificate's DER form.
func Fingerprint(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.Raw)
	return hex.EncodeToString(sum[:])
}

// ParseCertificatesPEM parses every CERTIFICATE block of data; other block
// types are refused. At least one certificate is required.
func ParseCertificatesPEM(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	rest := data
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("unexpected PEM block %q in a certificate bundle", block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parsing certificate %d of the bundle: %w", len(out)+1, err)
		}
		out = append(out, c)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("certificate bundle has trailing data that is not PEM")
	}
	if len(out) == 0 {
		return nil, errors.New("certificate bundle holds no certificate")
	}
	return out, nil
}

// EncodeBundle writes certificates as one PEM bundle, in order, without duplicates.
func EncodeBundle(certs ...*x509.Certificate) []byte {
	var b bytes.Buffer
	seen := map[string]bool{}
	for _, c := range certs {
		if fp := Fingerprint(c); !seen[fp] {
			seen[fp] = true
			_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
		}
	}
	return b.Bytes()
}

// CheckClusterBundle checks that every certificate of a trust bundle is a
// cluster CA of clusterID (a CA naming spiffe://<clusterID>), so a bundle
// never widens trust beyond the cluster.
func CheckClusterBundle(certs []*x509.Certificate, clusterID string) error {
	for _, c := range certs {
		if !c.IsCA {
			return fmt.Errorf("bundle certificate %q is not a CA", c.Subject.CommonName)
		}
		if td := trustDomainOf(c); td == "" || (clusterID != "" && td != clusterID) {
			return fmt.Errorf("bundle certificate %q is no cluster CA of %q (trust domain %q)", c.Subject.CommonName, clusterID, td)
		}
	}
	return nil
}

// Trust is what a server signs with and trusts while the cluster CA may be
// rotating: the signing CA and the bundle of every CA clients may hold
// certificates from (the signing CA is always part of it). It is swapped as
// a whole, so a reader never sees a signer outside its bundle.
type Trust struct {
	mu    sync.RWMutex
	state trustState
}

type trustState struct {
	signer    *CA
	bundlePEM []byte
	pool      *x509.CertPool
	fps       []string
}

// NewTrust builds the trust from the signing CA and the bundle PEM (nil or
// empty: the signer alone).
func NewTrust(signer *CA, bundlePEM []byte) (*Trust, error) {
	t := &Trust{}
	if _, err := t.Update(signer, bundlePEM); err != nil {
		return nil, err
	}
	return t, nil
}

func buildTrust(signer *CA, bundlePEM []byte) (trustState, error) {
	if signer == nil {
		return trustState{}, errors.New("trust: a signing CA is required")
	}
	td := signer.TrustDomain()
	if td == "" {
		return trustState{}, errors.New("trust: the signing CA is no cluster CA")
	}
	certs := []*x509.Certificate{signer.Cert}
	if len(bytes.TrimSpace(bundlePEM)) > 0 {
		b, err := ParseCertificatesPEM(bundlePEM)
		if err != nil {
			return trustState{}, fmt.Errorf("trust: CA bundle: %w", err)
		}
		if err := CheckClusterBundle(b, td); err != nil {
			return trustState{}, fmt.Errorf("trust: CA bundle: %w", err)
		}
		certs = append(certs, b...)
	}
	st := trustState{signer: signer, pool: x509.NewCertPool()}
	st.bundlePEM = EncodeBundle(certs...)
	seen := map[string]bool{}
	for _, c := range certs {
		if fp := Fingerprint(c); !seen[fp] {
			seen[fp] = true
			st.fps = append(st.fps, fp)
			st.pool.AddCert(c)
		}
	}
	return st, nil
}

// Update replaces the signer and bundle; it reports whether the signing CA
// changed (the caller then re-issues what it presents). A bad bundle is
// refused and leaves the trust as it was.
func (t *Trust) Update(signer *CA, bundlePEM []byte) (signerChanged bool, err error) {
	st, err := buildTrust(signer, bundlePEM)
	if err != nil {
		return false, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	changed := t.state.signer == nil || !bytes.Equal(t.state.signer.Cert.Raw, signer.Cert.Raw)
	t.state = st
	return changed, nil
}

func (t *Trust) get() trustState {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.state
}

// Signer is the CA new certificates are signed with.
func (t *Trust) Signer() *CA { return t.get().signer }

// Pool holds every trusted CA: what client certificates are verified against.
func (t *Trust) Pool() *x509.CertPool { return t.get().pool }

// BundlePEM is every trusted CA as PEM, the signer first: what clients are
// given to verify servers with.
func (t *Trust) BundlePEM() []byte { return t.get().bundlePEM }

// Fingerprints lists the trusted CAs, the signer first.
func (t *Trust) Fingerprints() []string { return append([]string(nil), t.get().fps...) }

// DynamicClientCAs makes a server configuration that requires client
// certificates verify them against clientCAs() as it is at each handshake
// (a pool that changes while the server runs, e.g. during a CA rotation).
// Each handshake uses a copy of cfg as it is then: apply it last, to the
// very configuration the server uses. A clone of cfg changed afterwards
// (say, given its own VerifyConnection) still hands out copies of cfg, so
// the change would be lost: call DynamicClientCAs on that clone again.
func DynamicClientCAs(cfg *tls.Config, clientCAs func() *x509.CertPool) {
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := cfg.Clone()
		c.GetConfigForClient = nil
		c.ClientCAs = clientCAs()
		return c, nil
	}
}

// ClientTLSDynamic is ClientTLS with roots read at each handshake, for
// clients whose trust bundle changes while they run: the chain is verified
// against roots() and the host name against serverName, then the verified
// connection is checked by verify (VerifyServerConnection when nil; a
// stricter check such as one of the server's shard may be given).
func ClientTLSDynamic(roots func() *x509.CertPool, cert *tls.Certificate, serverName string, verify func(tls.ConnectionState) error) *tls.Config {
	if verify == nil {
		verify = VerifyServerConnection
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, ServerName: serverName, InsecureSkipVerify: true}
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("nstance server: presented no certificate")
		}
		name := serverName
		if name == "" {
			name = cs.ServerName
		}
		if name == "" {
			return errors.New("nstance server: no server name to verify the certificate against")
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		chains, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{
			Roots: roots(), Intermediates: inter, DNSName: name, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		})
		if err != nil {
			return fmt.Errorf("nstance server: %w", err)
		}
		cs.VerifiedChains = chains
		return verify(cs)
	}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	return cfg
}
