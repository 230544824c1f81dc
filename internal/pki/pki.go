package pki

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"strings"
	"time"
)

// Role is what a client certificate grants access to.
type Role string

// Client roles. An admin is an operator (it may call every Operator RPC for
// its tenant) that may also take shard-wide actions such as RefreshConfig.
const (
	RoleAgent    Role = "agent"
	RoleOperator Role = "operator"
	RoleAdmin    Role = "admin"
)

// Valid reports whether r is a known client role.
func (r Role) Valid() bool { return r == RoleAgent || r == RoleOperator || r == RoleAdmin }

// AgentIdentityKeyName is the key name the Agent service uses on
// KeyGenRequests to ask an agent for a new identity key (renewal of its
// cluster-CA client certificate). Templates may not use it.
const AgentIdentityKeyName = "nstance-identity"

// clockSkew back-dates NotBefore so clients with slightly slow clocks accept new certificates.
const clockSkew = time.Minute

// IssuedAt is when cert was signed by this package: its NotBefore plus the
// back-dating every issuer here applies (second resolution).
func IssuedAt(cert *x509.Certificate) time.Time { return cert.NotBefore.Add(clockSkew) }

// Identity is who a client certificate belongs to.
type Identity struct {
	ClusterID string
	Tenant    string
	Role      Role
	ClientID  string
	// Shard and Group are set for agents (carried as OU "shard=..", "group=..").
	Shard string
	Group string
}

// URI is the SPIFFE-style identity placed in the certificate's URI SAN.
func (id Identity) URI() *url.URL {
	return &url.URL{Scheme: "spiffe", Host: id.ClusterID, Path: "/tenant/" + id.Tenant + "/" + string(id.Role) + "/" + id.ClientID}
}

// CA is the cluster certificate authority.
type CA struct {
	Cert    *x509.Certificate
	CertPEM []byte
	Key     crypto.Signer
}

func serial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("generating serial number: %w", err)
	}
	return n.Add(n, big.NewInt(1)), nil
}

// GenerateCA creates a new self-signed Ed25519 CA for a cluster.
func GenerateCA(clusterID string, validity time.Duration, now time.Time) (*CA, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating CA key: %w", err)
	}
	return SelfSignCA(clusterID, priv, validity, now)
}

// SelfSignCA makes the CA certificate for an existing Ed25519 key.
func SelfSignCA(clusterID string, priv ed25519.PrivateKey, validity time.Duration, now time.Time) (*CA, error) {
	return selfSignCA("cluster", clusterID, priv, []*url.URL{{Scheme: "spiffe", Host: clusterID}}, validity, now)
}

// selfSignCA makes a self-signed Ed25519 CA certificate named after its kind
// (cluster or workload) carrying the given URI SANs; it may sign leaves only.
func selfSignCA(kind, clusterID string, priv ed25519.PrivateKey, uris []*url.URL, validity time.Duration, now time.Time) (*CA, error) {
	sn, err := serial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: "nstance " + kind + " CA " + clusterID, Organization: []string{"nstance"}},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(validity),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		URIs:                  uris,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, priv.Public(), priv)
	if err != nil {
		return nil, fmt.Errorf("self-signing %s CA certificate: %w", kind, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing new %s CA certificate: %w", kind, err)
	}
	return &CA{Cert: cert, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), Key: priv}, nil
}

// LoadCA parses a CA certificate and its PKCS#8 private key (both PEM) and
// checks that they belong together.
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	cert, err := ParseCertificatePEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("CA certificate is not marked as a CA")
	}
	key, err := ParsePrivateKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	if !publicKeysEqual(cert.PublicKey, key.Public()) {
		return nil, errors.New("CA key does not match the CA certificate")
	}
	return &CA{Cert: cert, CertPEM: certPEM, Key: key}, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ae, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ae.Equal(b)
}

// TrustDomain is the cluster id named by the CA certificate's URI SAN
// (spiffe://<cluster>); empty for a CA that names none, such as the
// workload CA, which therefore cannot issue control-plane identities.
func (ca *CA) TrustDomain() string { return trustDomainOf(ca.Cert) }

func trustDomainOf(cert *x509.Certificate) string {
	for _, u := range cert.URIs {
		if u.Scheme == "spiffe" && u.Host != "" && (u.Path == "" || u.Path == "/") {
			return u.Host
		}
	}
	return ""
}

// controlPlane checks that ca is the cluster CA of clusterID.
func (ca *CA) controlPlane(clusterID string) error {
	td := ca.TrustDomain()
	if td == "" {
		return errors.New("this CA is not a cluster CA (it names no trust domain) and issues no control-plane identities")
	}
	if clusterID != "" && td != clusterID {
		return fmt.Errorf("identity of cluster %q cannot be issued by the CA of cluster %q", clusterID, td)
	}
	return nil
}

// Pool returns a certificate pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// ClientRequest describes a client certificate to issue.
type ClientRequest struct {
	Identity  Identity
	PublicKey crypto.PublicKey
	IPs       []net.IP
	DNSNames  []string
	Validity  time.Duration
}

// IssueClient signs a client certificate for the identity and returns it as PEM.
func (ca *CA) IssueClient(req ClientRequest, now time.Time) (*x509.Certificate, []byte, error) {
	id := req.Identity
	if err := ValidateIdentity(id); err != nil {
		return nil, nil, err
	}
	if req.Validity <= 0 {
		return nil, nil, errors.New("certificate validity must be positive")
	}
	if err := ca.controlPlane(id.ClusterID); err != nil {
		return nil, nil, err
	}
	var ou []string
	if id.Shard != "" {
		ou = append(ou, "shard="+id.Shard)
	}
	if id.Group != "" {
		ou = append(ou, "group="+id.Group)
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: id.ClientID, Organization: []string{id.Tenant}, OrganizationalUnit: ou},
		NotBefore:   now.Add(-clockSkew),
		NotAfter:    now.Add(req.Validity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:        []*url.URL{id.URI()},
		IPAddresses: req.IPs,
		DNSNames:    req.DNSNames,
	}
	return ca.sign(tmpl, req.PublicKey)
}

// ServerIdentity names one nstance-server: the shard it serves and its
// server id. Server certificates carry it as the URI SAN
// spiffe://<cluster>/shard/<shard>/server/<server-id>, which agents and
// operators check (VerifyServerConnection) besides the CA signature.
type ServerIdentity struct {
	// ClusterID is filled in from the CA when empty.
	ClusterID string
	Shard     string
	ServerID  string
}

// URI is the SPIFFE identity of the server.
func (s ServerIdentity) URI() *url.URL {
	return &url.URL{Scheme: "spiffe", Host: s.ClusterID, Path: "/shard/" + s.Shard + "/server/" + s.ServerID}
}

func (s ServerIdentity) validate() error {
	for _, f := range []struct{ name, v string }{{"cluster id", s.ClusterID}, {"shard", s.Shard}, {"server id", s.ServerID}} {
		if f.v == "" {
			return fmt.Errorf("server identity: %s is empty", f.name)
		}
		if strings.ContainsAny(f.v, "/?#@: ") {
			return fmt.Errorf("server identity: %s %q contains a character not allowed in a URI path segment", f.name, f.v)
		}
	}
	return nil
}

// IssueServer signs a TLS server certificate for the server identity and the
// given hosts (IP addresses or DNS names) and returns the certificate and PEM.
func (ca *CA) IssueServer(id ServerIdentity, hosts []string, pub crypto.PublicKey, validity time.Duration, now time.Time) (*x509.Certificate, []byte, error) {
	if id.ClusterID == "" {
		id.ClusterID = ca.TrustDomain()
	}
	if err := id.validate(); err != nil {
		return nil, nil, err
	}
	if err := ca.controlPlane(id.ClusterID); err != nil {
		return nil, nil, err
	}
	if validity <= 0 {
		return nil, nil, errors.New("certificate validity must be positive")
	}
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: "nstance-server " + id.ServerID, Organization: []string{"nstance"}},
		NotBefore:   now.Add(-clockSkew),
		NotAfter:    now.Add(validity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		URIs:        []*url.URL{id.URI()},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.sign(tmpl, pub)
}

func (ca *CA) sign(tmpl *x509.Certificate, pub crypto.PublicKey) (*x509.Certificate, []byte, error) {
	sn, err := serial()
	if err != nil {
		return nil, nil, err
	}
	tmpl.SerialNumber = sn
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("signing certificate for %q: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("parsing issued certificate: %w", err)
	}
	return cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// ServerKeyPair issues a fresh Ed25519 server certificate and returns it as a tls.Certificate.
func (ca *CA) ServerKeyPair(id ServerIdentity, hosts []string, validity time.Duration, now time.Time) (tls.Certificate, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("generating server key: %w", err)
	}
	cert, _, err := ca.IssueServer(id, hosts, pub, validity, now)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: priv, Leaf: cert}, nil
}

// ValidateIdentity checks that every part of an identity is usable in a certificate.
func ValidateIdentity(id Identity) error {
	if !id.Role.Valid() {
		return fmt.Errorf("invalid role %q", id.Role)
	}
	for _, f := range []struct{ name, v string }{{"cluster id", id.ClusterID}, {"tenant", id.Tenant}, {"client id", id.ClientID}} {
		if f.v == "" {
			return fmt.Errorf("identity: %s is empty", f.name)
		}
		if strings.ContainsAny(f.v, "/?#@: ") {
			return fmt.Errorf("identity: %s %q contains a character not allowed in a URI path segment", f.name, f.v)
		}
	}
	return nil
}

// IdentityFromCert reads the identity of a (verified) client certificate and
// checks that CN, O and the URI SAN agree. clusterID, when not empty, must match.
func IdentityFromCert(cert *x509.Certificate, clusterID string) (Identity, error) {
	var uri *url.URL
	for _, u := range cert.URIs {
		if u.Scheme == "spiffe" {
			if uri != nil {
				return Identity{}, errors.New("certificate carries more than one spiffe URI")
			}
			uri = u
		}
	}
	if uri == nil {
		return Identity{}, errors.New("certificate carries no spiffe URI SAN")
	}
	parts := strings.Split(strings.TrimPrefix(uri.Path, "/"), "/")
	if len(parts) != 4 || parts[0] != "tenant" {
		return Identity{}, fmt.Errorf("certificate URI %q is not spiffe://<cluster>/tenant/<tenant>/<role>/<id>", uri)
	}
	id := Identity{ClusterID: uri.Host, Tenant: parts[1], Role: Role(parts[2]), ClientID: parts[3]}
	if err := ValidateIdentity(id); err != nil {
		return Identity{}, err
	}
	if clusterID != "" && id.ClusterID != clusterID {
		return Identity{}, fmt.Errorf("certificate belongs to cluster %q, not %q", id.ClusterID, clusterID)
	}
	if cert.Subject.CommonName != id.ClientID {
		return Identity{}, fmt.Errorf("certificate CN %q does not match URI client id %q", cert.Subject.CommonName, id.ClientID)
	}
	if len(cert.Subject.Organization) != 1 || cert.Subject.Organization[0] != id.Tenant {
		return Identity{}, fmt.Errorf("certificate O %v does not match URI tenant %q", cert.Subject.Organization, id.Tenant)
	}
	for _, ou := range cert.Subject.OrganizationalUnit {
		if v, ok := strings.CutPrefix(ou, "shard="); ok {
			id.Shard = v
		} else if v, ok := strings.CutPrefix(ou, "group="); ok {
			id.Group = v
		}
	}
	return id, nil
}

// ServerIdentityFromCert reads the server identity of a (verified) server
// certificate: exactly one spiffe URI, of the form
// spiffe://<cluster>/shard/<shard>/server/<server-id>. clusterID, when not
// empty, must match.
func ServerIdentityFromCert(cert *x509.Certificate, clusterID string) (ServerIdentity, error) {
	var uri *url.URL
	for _, u := range cert.URIs {
		if u.Scheme == "spiffe" {
			if uri != nil {
				return ServerIdentity{}, errors.New("certificate carries more than one spiffe URI")
			}
			uri = u
		}
	}
	if uri == nil {
		return ServerIdentity{}, errors.New("certificate carries no spiffe URI SAN, so it is no nstance-server certificate")
	}
	parts := strings.Split(strings.TrimPrefix(uri.Path, "/"), "/")
	if len(parts) != 4 || parts[0] != "shard" || parts[2] != "server" || uri.User != nil || uri.Port() != "" || uri.RawQuery != "" || uri.Fragment != "" {
		return ServerIdentity{}, fmt.Errorf("certificate URI %q is not a server identity spiffe://<cluster>/shard/<shard>/server/<id>", uri)
	}
	id := ServerIdentity{ClusterID: uri.Host, Shard: parts[1], ServerID: parts[3]}
	if err := id.validate(); err != nil {
		return ServerIdentity{}, err
	}
	if clusterID != "" && id.ClusterID != clusterID {
		return ServerIdentity{}, fmt.Errorf("server certificate belongs to cluster %q, not %q", id.ClusterID, clusterID)
	}
	return id, nil
}

// ParseCertificatePEM parses the first CERTIFICATE block.
func ParseCertificatePEM(data []byte) (*x509.Certificate, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("no CERTIFICATE PEM block found")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parsing certificate: %w", err)
	}
	return cert, nil
}

// MarshalPrivateKeyPEM encodes a private key as PKCS#8 PEM.
func MarshalPrivateKeyPEM(key crypto.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParsePrivateKeyPEM parses a PKCS#8 PEM private key that can sign.
func ParsePrivateKeyPEM(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PRIVATE KEY" {
		return nil, errors.New("no PRIVATE KEY PEM block found")
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parsing private key: %w", err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("private key of type %T cannot sign", k)
	}
	return s, nil
}

// MarshalPublicKeyPEM encodes a public key as PKIX PEM.
func MarshalPublicKeyPEM(pub crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("encoding public key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// ParseEd25519PublicKeyPEM parses a PKIX PEM public key and requires Ed25519.
func ParseEd25519PublicKeyPEM(data []byte) (ed25519.PublicKey, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "PUBLIC KEY" {
		return nil, errors.New("no PUBLIC KEY PEM block found")
	}
	k, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parsing public key: %w", err)
	}
	pub, ok := k.(ed25519.PublicKey)
	if !ok {
		return nil, fmt.Errorf("public key is %T, want Ed25519", k)
	}
	return pub, nil
}
