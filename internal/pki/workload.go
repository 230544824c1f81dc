package pki

import (
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"
)

// DefaultWorkloadUsages are the extended key usages of a workload
// certificate whose template names none: TLS server and TLS client, so the
// usual service-to-service case works, and nothing else (never "any").
var DefaultWorkloadUsages = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}

// GenerateWorkloadCA creates a new self-signed Ed25519 workload CA.
func GenerateWorkloadCA(clusterID string, validity time.Duration, now time.Time) (*CA, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating workload CA key: %w", err)
	}
	return SelfSignWorkloadCA(clusterID, priv, validity, now)
}

// SelfSignWorkloadCA makes the workload CA certificate for an existing
// Ed25519 key. The workload CA signs the certificates instance templates ask
// for. Unlike the cluster CA it names no trust domain (no URI SAN), no
// Nstance listener trusts it, and it cannot issue control-plane identities.
func SelfSignWorkloadCA(clusterID string, priv ed25519.PrivateKey, validity time.Duration, now time.Time) (*CA, error) {
	return selfSignCA("workload", clusterID, priv, nil, validity, now)
}

// SelfSignTenantWorkloadCA makes the workload CA certificate of one tenant
// for an existing Ed25519 key: like SelfSignWorkloadCA, with the tenant in
// its common name. Each tenant's template certificates are signed by its own
// CA and each tenant's instances trust only theirs, so no tenant can obtain
// a certificate another tenant's instances trust.
func SelfSignTenantWorkloadCA(clusterID, tenant string, priv ed25519.PrivateKey, validity time.Duration, now time.Time) (*CA, error) {
	if tenant == "" {
		return nil, errors.New("tenant workload CA: tenant is required")
	}
	return selfSignCA("workload", clusterID+" tenant "+tenant, priv, nil, validity, now)
}

// TenantWorkloadCACommonName is the common name SelfSignTenantWorkloadCA
// gives a tenant's CA (a loader checks it, so one tenant's CA copied to
// another tenant's keys is refused).
func TenantWorkloadCACommonName(clusterID, tenant string) string {
	return "nstance workload CA " + clusterID + " tenant " + tenant
}

// WorkloadPolicy is what a workload certificate may never carry: a URI in
// the cluster's trust domain (it would name a control-plane identity) or a
// name or address of an nstance-server (it would impersonate a server).
type WorkloadPolicy struct {
	// TrustDomain is the cluster id: every spiffe://<TrustDomain>... URI is refused.
	TrustDomain string
	// ServerHosts are the DNS names and IP addresses of the servers.
	ServerHosts []string
}

func normDNS(s string) string { return strings.TrimSuffix(strings.ToLower(strings.TrimSpace(s)), ".") }

// CheckDNS refuses a DNS name (or an IP written as one) that is, or as a
// wildcard covers, a server name.
func (p WorkloadPolicy) CheckDNS(name string) error {
	if ip := net.ParseIP(strings.TrimSpace(name)); ip != nil {
		return p.CheckIP(ip)
	}
	n := normDNS(name)
	for _, h := range p.ServerHosts {
		if net.ParseIP(h) != nil || h == "" {
			continue
		}
		s := normDNS(h)
		if n == s {
			return fmt.Errorf("DNS name %q is a name of the nstance-server", name)
		}
		if rest, ok := strings.CutPrefix(n, "*."); ok {
			if _, parent, found := strings.Cut(s, "."); found && parent == rest {
				return fmt.Errorf("wildcard DNS name %q covers %q, a name of the nstance-server", name, h)
			}
		}
	}
	return nil
}

// CheckIP refuses an address of a server.
func (p WorkloadPolicy) CheckIP(ip net.IP) error {
	for _, h := range p.ServerHosts {
		if sip := net.ParseIP(h); sip != nil && sip.Equal(ip) {
			return fmt.Errorf("IP address %s is an address of the nstance-server", ip)
		}
	}
	return nil
}

// CheckURI refuses any spiffe URI in the cluster's trust domain (compared
// without regard to case, port or user info) and spiffe URIs that are not in
// the plain spiffe://<domain>/<path> form.
func (p WorkloadPolicy) CheckURI(u *url.URL) error {
	if !strings.EqualFold(u.Scheme, "spiffe") {
		return nil
	}
	if u.Opaque != "" || u.Host == "" {
		return fmt.Errorf("URI %q is not of the form spiffe://<trust domain>/<path>", u)
	}
	if p.TrustDomain == "" {
		return fmt.Errorf("URI %q: spiffe URIs are refused while the cluster trust domain is unknown", u)
	}
	if strings.EqualFold(normDNS(u.Hostname()), normDNS(p.TrustDomain)) {
		return fmt.Errorf("URI %q is in the cluster's trust domain spiffe://%s, which only the control plane may use", u, p.TrustDomain)
	}
	return nil
}

// Check applies every rule to the names of one certificate.
func (p WorkloadPolicy) Check(commonName string, dns []string, ips []net.IP, uris []*url.URL) error {
	var errs []error
	if commonName != "" {
		if err := p.CheckDNS(commonName); err != nil {
			errs = append(errs, fmt.Errorf("common name: %w", err))
		}
	}
	for _, d := range dns {
		if err := p.CheckDNS(d); err != nil {
			errs = append(errs, err)
		}
	}
	for _, ip := range ips {
		if err := p.CheckIP(ip); err != nil {
			errs = append(errs, err)
		}
	}
	for _, u := range uris {
		if err := p.CheckURI(u); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// WorkloadRequest describes a workload certificate to issue.
type WorkloadRequest struct {
	CommonName string
	// Organization is set to the tenant.
	Organization string
	DNSNames     []string
	IPs          []net.IP
	URIs         []*url.URL
	// Usages are ServerAuth and/or ClientAuth; empty means DefaultWorkloadUsages.
	Usages    []x509.ExtKeyUsage
	PublicKey crypto.PublicKey
	Validity  time.Duration
}

// IssueWorkload signs a workload certificate with a workload CA after
// checking its names against policy. The certificate is never a CA, always
// has explicit extended key usages (server and/or client auth) and key usage
// digitalSignature (plus keyEncipherment for RSA keys).
func (ca *CA) IssueWorkload(req WorkloadRequest, policy WorkloadPolicy, now time.Time) (*x509.Certificate, []byte, error) {
	if td := ca.TrustDomain(); td != "" {
		return nil, nil, fmt.Errorf("refusing to sign a workload certificate with the cluster CA of %q: workload certificates come from the workload CA", td)
	}
	if req.Validity <= 0 {
		return nil, nil, errors.New("certificate validity must be positive")
	}
	if req.PublicKey == nil {
		return nil, nil, errors.New("public key is required")
	}
	if err := policy.Check(req.CommonName, req.DNSNames, req.IPs, req.URIs); err != nil {
		return nil, nil, fmt.Errorf("workload certificate refused: %w", err)
	}
	usages := req.Usages
	if len(usages) == 0 {
		usages = DefaultWorkloadUsages
	}
	seen := map[x509.ExtKeyUsage]bool{}
	var eku []x509.ExtKeyUsage
	for _, u := range usages {
		if u != x509.ExtKeyUsageServerAuth && u != x509.ExtKeyUsageClientAuth {
			return nil, nil, fmt.Errorf("workload certificate refused: extended key usage %d is not server or client auth", u)
		}
		if !seen[u] {
			seen[u] = true
			eku = append(eku, u)
		}
	}
	var org []string
	if req.Organization != "" {
		org = []string{req.Organization}
	}
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: req.CommonName, Organization: org},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(req.Validity),
		BasicConstraintsValid: true,
		IsCA:                  false,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           eku,
		DNSNames:              req.DNSNames,
		IPAddresses:           req.IPs,
		URIs:                  req.URIs,
	}
	if _, ok := req.PublicKey.(*rsa.PublicKey); ok {
		tmpl.KeyUsage |= x509.KeyUsageKeyEncipherment
	}
	return ca.sign(tmpl, req.PublicKey)
}
