package pki

import (
	"crypto"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Kubernetes names an imported CA's certificates are judged by.
const (
	// GroupMasters is the Kubernetes group that bypasses authorization: no
	// template certificate may ever carry it.
	GroupMasters = "system:masters"
	// GroupNodes is the group of kubelet identities (Node authorizer).
	GroupNodes = "system:nodes"
	// NodeUserPrefix starts a kubelet's user name: system:node:<node name>.
	NodeUserPrefix = "system:node:"
	// systemPrefix starts every name Kubernetes reserves.
	systemPrefix = "system:"
)

// ImportedPolicy is what a certificate signed by an imported CA (the third
// trust root: a CA the admin provides, such as a workload Kubernetes
// cluster's) is checked against.
type ImportedPolicy struct {
	// Names are the name rules of workload certificates: no URI in the
	// cluster's trust domain, no server name or address.
	Names WorkloadPolicy
	// DeniedGroups are organizations refused besides system:masters.
	DeniedGroups []string
	// NodeName is the requesting instance's own Kubernetes node name: the
	// only node identity (CN system:node:<name>) it may obtain.
	NodeName string
}

// SubjectRequest describes a certificate to issue with an imported CA.
type SubjectRequest struct {
	CommonName          string
	Organization        []string
	OrganizationalUnits []string
	DNSNames            []string
	IPs                 []net.IP
	URIs                []*url.URL
	// Usages are ServerAuth and/or ClientAuth; at least one is required.
	Usages    []x509.ExtKeyUsage
	PublicKey crypto.PublicKey
	Validity  time.Duration
}

// CheckSubject applies the subject rules of imported-CA certificates: no
// Kubernetes group in deny (system:masters always), no other reserved
// "system:" group than system:nodes, and a node identity only for nodeName:
// a certificate with O=system:nodes or a CN starting with system:node: must
// have exactly CN system:node:<nodeName>; any other reserved "system:" CN is
// refused. An empty nodeName allows no node identity.
func CheckSubject(cn string, orgs []string, deny []string, nodeName string) error {
	var errs []error
	nodeIdentity := strings.HasPrefix(cn, NodeUserPrefix)
	for _, o := range orgs {
		switch {
		case strings.EqualFold(strings.TrimSpace(o), GroupMasters):
			errs = append(errs, fmt.Errorf("organization %q: the group %s is never issued", o, GroupMasters))
		case slices.Contains(deny, o):
			errs = append(errs, fmt.Errorf("organization %q is in certificates.denied_groups", o))
		case o == GroupNodes:
			nodeIdentity = true
		case strings.HasPrefix(strings.ToLower(strings.TrimSpace(o)), systemPrefix):
			errs = append(errs, fmt.Errorf("organization %q: reserved Kubernetes groups other than %s are never issued", o, GroupNodes))
		case o != strings.TrimSpace(o) || o == "":
			errs = append(errs, fmt.Errorf("organization %q: empty or padded with spaces", o))
		}
	}
	switch {
	case nodeIdentity:
		if nodeName == "" {
			errs = append(errs, fmt.Errorf("common name %q: a node identity (%s or CN %s...) is only issued to an instance, for its own node name", cn, GroupNodes, NodeUserPrefix))
		} else if want := NodeUserPrefix + nodeName; cn != want {
			errs = append(errs, fmt.Errorf("common name %q: a node identity must be %q, the instance's own node name", cn, want))
		}
	case strings.HasPrefix(strings.ToLower(strings.TrimSpace(cn)), systemPrefix):
		errs = append(errs, fmt.Errorf("common name %q: reserved Kubernetes user names are never issued (only %s<own node name>)", cn, NodeUserPrefix))
	}
	return errors.Join(errs...)
}

// IssueImported signs a certificate with an imported CA after the subject
// rules (CheckSubject) and the workload name rules. The certificate is
// never a CA and always has explicit extended key usages. The cluster CA,
// and any CA carrying a URI in a trust domain, is refused as signer.
func (ca *CA) IssueImported(req SubjectRequest, policy ImportedPolicy, now time.Time) (*x509.Certificate, []byte, error) {
	if td := ca.TrustDomain(); td != "" {
		return nil, nil, fmt.Errorf("refusing to sign with the cluster CA of %q: template certificates come from the workload CA or an imported CA", td)
	}
	if req.Validity <= 0 {
		return nil, nil, errors.New("certificate validity must be positive")
	}
	if req.PublicKey == nil {
		return nil, nil, errors.New("public key is required")
	}
	if len(req.Usages) == 0 {
		return nil, nil, errors.New("certificate refused: no usages (server_auth and/or client_auth are required)")
	}
	if err := CheckSubject(req.CommonName, req.Organization, policy.DeniedGroups, policy.NodeName); err != nil {
		return nil, nil, fmt.Errorf("certificate refused: %w", err)
	}
	// The common name of a node identity is a user name, not a host name.
	cn := req.CommonName
	if strings.HasPrefix(cn, NodeUserPrefix) {
		cn = ""
	}
	if err := policy.Names.Check(cn, req.DNSNames, req.IPs, req.URIs); err != nil {
		return nil, nil, fmt.Errorf("certificate refused: %w", err)
	}
	var eku []x509.ExtKeyUsage
	for _, u := range req.Usages {
		if u != x509.ExtKeyUsageServerAuth && u != x509.ExtKeyUsageClientAuth {
			return nil, nil, fmt.Errorf("certificate refused: extended key usage %d is not server or client auth", u)
		}
		if !slices.Contains(eku, u) {
			eku = append(eku, u)
		}
	}
	notAfter := now.Add(req.Validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		Subject: pkix.Name{CommonName: req.CommonName, Organization: slices.Clone(req.Organization),
			OrganizationalUnit: slices.Clone(req.OrganizationalUnits)},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              notAfter,
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

// CheckImportable refuses a CA the admin offers for import when it is not
// a CA, has expired, or belongs to a trust domain (the cluster CA and
// anything shaped like it); the key must match the certificate (LoadCA).
func CheckImportable(ca *CA, now time.Time) error {
	c := ca.Cert
	if !c.IsCA || !c.BasicConstraintsValid {
		return errors.New("the certificate is not a CA (basic constraints CA:TRUE missing)")
	}
	if c.KeyUsage != 0 && c.KeyUsage&x509.KeyUsageCertSign == 0 {
		return errors.New("the CA certificate's key usage does not allow certificate signing")
	}
	if now.After(c.NotAfter) {
		return fmt.Errorf("the CA certificate expired at %s", c.NotAfter.UTC().Format(time.RFC3339))
	}
	if td := ca.TrustDomain(); td != "" {
		return fmt.Errorf("the CA carries the trust domain spiffe://%s: Nstance's own CAs cannot be imported", td)
	}
	return nil
}

// ParseImportedKeyPEM parses the private key of a CA offered for import in
// the forms CA tools write: PKCS#8 ("PRIVATE KEY"), PKCS#1 ("RSA PRIVATE
// KEY", kubeadm's ca.key) or SEC 1 ("EC PRIVATE KEY").
func ParseImportedKeyPEM(data []byte) (crypto.Signer, error) {
	for rest := data; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			return nil, errors.New("no PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY PEM block found")
		}
		switch block.Type {
		case "PRIVATE KEY":
			return ParsePrivateKeyPEM(pem.EncodeToMemory(block))
		case "RSA PRIVATE KEY":
			k, err := x509.ParsePKCS1PrivateKey(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("parsing RSA private key: %w", err)
			}
			return k, nil
		case "EC PRIVATE KEY":
			k, err := x509.ParseECPrivateKey(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("parsing EC private key: %w", err)
			}
			return k, nil
		}
		// Other blocks (e.g. "EC PARAMETERS") are skipped.
	}
}

// SameKey reports whether two CAs share their public key (the same CA,
// whatever certificate wraps it).
func SameKey(a, b *CA) bool { return publicKeysEqual(a.Cert.PublicKey, b.Cert.PublicKey) }
