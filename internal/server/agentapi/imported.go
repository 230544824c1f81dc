package agentapi

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"time"

	"github.com/nstance-dev/nstance/internal/pki"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// ImportedSigner issues the certificates templates ask an imported CA for
// (the third trust root, e.g. a workload Kubernetes cluster's CA signing
// kubelet certificates). Each one passes pki.IssueImported: system:masters
// and certificates.denied_groups are refused, a node identity is issued
// only as system:node:<the instance's own id>, names follow the workload
// rules. Nothing is signed for an instance that Alive refuses.
type ImportedSigner struct {
	// CA returns the CA imported under a name (importedca.Cache.Get).
	CA func(ctx context.Context, name string) (*pki.CA, error)
	// MaxValidity caps (and, when a spec sets none, is) the lifetime.
	MaxValidity time.Duration
	// Policy returns the names no template certificate may carry and
	// DeniedGroups the refused organizations; both read at every signing.
	Policy       func() pki.WorkloadPolicy
	DeniedGroups func() []string
	// Alive refuses instances that may no longer get certificates (record
	// deleted, being deleted, of another tenant).
	Alive func(ctx context.Context, ref Ref) error
	Now   func() time.Time
}

// Sign implements Signer.
func (c *ImportedSigner) Sign(ctx context.Context, ref Ref, spec *nstancev1.CertificateSpec, pub crypto.PublicKey) ([]byte, time.Time, time.Time, error) {
	fail := func(err error) ([]byte, time.Time, time.Time, error) {
		return nil, time.Time{}, time.Time{}, fmt.Errorf("signer: instance %s, CA %q: %w", ref.InstanceID, spec.GetCa(), err)
	}
	if c.CA == nil || c.MaxValidity <= 0 || c.Policy == nil || c.DeniedGroups == nil || c.Alive == nil {
		return fail(errors.New("CA lookup, maximum validity, policy, denied groups and instance check are required"))
	}
	if err := c.Alive(ctx, ref); err != nil {
		return fail(err)
	}
	ca, err := c.CA(ctx, spec.GetCa())
	if err != nil {
		return fail(err)
	}
	now := time.Now()
	if c.Now != nil {
		now = c.Now()
	}
	req := pki.SubjectRequest{
		CommonName: spec.GetCommonName(), Organization: spec.GetOrganization(), OrganizationalUnits: spec.GetOrganizationalUnits(),
		DNSNames: spec.GetDnsNames(), PublicKey: pub, Validity: c.MaxValidity,
	}
	if d := spec.GetValidity().AsDuration(); spec.GetValidity() != nil && d > 0 && d < req.Validity {
		req.Validity = d
	}
	if req.Usages, err = extUsages(spec.GetUsages()); err != nil {
		return fail(err)
	}
	if req.IPs, req.URIs, err = parseNames(spec.GetIpAddresses(), spec.GetUris()); err != nil {
		return fail(err)
	}
	cert, certPEM, err := ca.IssueImported(req, pki.ImportedPolicy{Names: c.Policy(), DeniedGroups: c.DeniedGroups(), NodeName: ref.InstanceID}, now)
	if err != nil {
		return fail(err)
	}
	return certPEM, cert.NotBefore, cert.NotAfter, nil
}

// extUsages maps the spec's usages; at least one is required.
func extUsages(in []nstancev1.CertificateUsage) ([]x509.ExtKeyUsage, error) {
	if len(in) == 0 {
		return nil, errors.New("the certificate spec lists no usages (server_auth and/or client_auth are required)")
	}
	var out []x509.ExtKeyUsage
	for _, u := range in {
		switch u {
		case nstancev1.CertificateUsage_CERTIFICATE_USAGE_SERVER_AUTH:
			out = append(out, x509.ExtKeyUsageServerAuth)
		case nstancev1.CertificateUsage_CERTIFICATE_USAGE_CLIENT_AUTH:
			out = append(out, x509.ExtKeyUsageClientAuth)
		default:
			return nil, fmt.Errorf("unsupported usage %s", u)
		}
	}
	return out, nil
}

// parseNames parses IP and URI subject alternative names.
func parseNames(ips, uris []string) ([]net.IP, []*url.URL, error) {
	var outIPs []net.IP
	var outURIs []*url.URL
	for _, s := range ips {
		ip := net.ParseIP(s)
		if ip == nil {
			return nil, nil, fmt.Errorf("%q is not an IP address", s)
		}
		outIPs = append(outIPs, ip)
	}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil || u.Scheme == "" {
			return nil, nil, fmt.Errorf("%q is not an absolute URI", s)
		}
		outURIs = append(outURIs, u)
	}
	return outIPs, outURIs, nil
}

// CASigners routes each certificate to the signer of the CA its spec
// names: the workload CA when it names none, an imported CA otherwise.
type CASigners struct {
	Workload Signer
	Imported Signer
}

// Sign implements Signer.
func (r CASigners) Sign(ctx context.Context, ref Ref, spec *nstancev1.CertificateSpec, pub crypto.PublicKey) ([]byte, time.Time, time.Time, error) {
	if spec.GetCa() == "" {
		return r.Workload.Sign(ctx, ref, spec, pub)
	}
	if r.Imported == nil {
		return nil, time.Time{}, time.Time{}, fmt.Errorf("signer: instance %s: no imported CAs are configured (CA %q)", ref.InstanceID, spec.GetCa())
	}
	return r.Imported.Sign(ctx, ref, spec, pub)
}
