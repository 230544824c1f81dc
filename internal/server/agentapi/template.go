package agentapi

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nstance-dev/nstance/internal/config"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// TemplateData is what file contents and certificate fields may refer to,
// e.g. {{ .InstanceID }} or {{ .Vars.role }}.
type TemplateData = config.TemplateData

// TemplateInput is an instance's template with the data to render it.
type TemplateInput struct {
	Template config.Template
	Data     TemplateData
	// TrustedVars are the vars the config itself sets for the instance
	// (defaults < template < static group): the only ones, with the
	// tenant_vars a certificate lists, that certificates of an imported CA
	// are rendered with.
	TrustedVars map[string]string
}

// TemplateSource is the Source that renders config templates.
type TemplateSource struct {
	// Lookup returns the template and effective vars of an instance, or an
	// error wrapping ErrUnknownInstance.
	Lookup func(ctx context.Context, ref Ref) (*TemplateInput, error)
	// Secret reads the value of a file of kind secret from its source,
	// Storage the object a file of kind storage names (FileSources
	// implements both). A failure leaves that file out of the delivery,
	// reported, without failing the plan.
	Secret  func(ctx context.Context, f config.TemplateFile) (Fetched, error)
	Storage func(ctx context.Context, object string) (Fetched, error)
	// Bundle returns what ca_bundle files without content deliver to an
	// instance of tenant: its tenant's workload CA bundle, which verifies
	// the certificates templates ask for for that tenant and no other's.
	Bundle func(ctx context.Context, tenant string) ([]byte, error)
	// CABundle is delivered instead when Bundle is nil (one workload CA for
	// every tenant: tests and tools with a single tenant).
	CABundle []byte
}

var (
	keyTypes = map[string]nstancev1.KeyType{
		"ed25519": nstancev1.KeyType_KEY_TYPE_ED25519, "ecdsa-p256": nstancev1.KeyType_KEY_TYPE_ECDSA_P256,
		"ecdsa-p384": nstancev1.KeyType_KEY_TYPE_ECDSA_P384, "rsa-2048": nstancev1.KeyType_KEY_TYPE_RSA_2048,
		"rsa-4096": nstancev1.KeyType_KEY_TYPE_RSA_4096,
	}
	fileKinds = map[string]nstancev1.FileKind{
		"certificate": nstancev1.FileKind_FILE_KIND_CERTIFICATE, "ca_bundle": nstancev1.FileKind_FILE_KIND_CA_BUNDLE,
		"secret": nstancev1.FileKind_FILE_KIND_SECRET, "storage": nstancev1.FileKind_FILE_KIND_STRING, "env": nstancev1.FileKind_FILE_KIND_ENV,
		"json": nstancev1.FileKind_FILE_KIND_JSON, "string": nstancev1.FileKind_FILE_KIND_STRING,
	}
	usages = map[string]nstancev1.CertificateUsage{
		"server_auth": nstancev1.CertificateUsage_CERTIFICATE_USAGE_SERVER_AUTH,
		"client_auth": nstancev1.CertificateUsage_CERTIFICATE_USAGE_CLIENT_AUTH,
	}
)

// Plan implements Source.
func (s *TemplateSource) Plan(ctx context.Context, ref Ref) (*Plan, error) {
	if s.Lookup == nil {
		return nil, errors.New("template source: no lookup")
	}
	in, err := s.Lookup(ctx, ref)
	if err != nil {
		return nil, err
	}
	t := in.Template
	data := in.Data
	p := &Plan{}
	names := sortedKeys(t.Keys)
	for _, name := range names {
		k := t.Keys[name]
		kt, ok := keyTypes[strings.ToLower(k.Type)]
		if !ok {
			return nil, fmt.Errorf("keys.%s.type: unknown key type %q", name, k.Type)
		}
		spec := &nstancev1.KeySpec{Name: name, Type: kt}
		if c := k.Certificate; c != nil {
			key := "keys." + name + ".certificate"
			cdata := config.CertificateData(c, data, in.TrustedVars)
			rc, err := config.RenderCertificate(key, c, cdata)
			if err != nil {
				return nil, err
			}
			cs := &nstancev1.CertificateSpec{CommonName: rc.CommonName, DnsNames: dropEmpty(rc.DNSNames),
				IpAddresses: dropEmpty(rc.IPAddresses), Uris: dropEmpty(rc.URIs)}
			if c.Imported() {
				rs, err := config.RenderSubject(key, c, cdata)
				if err != nil {
					return nil, err
				}
				cs.Ca, cs.Organization, cs.OrganizationalUnits = c.CA, rs.Organization, rs.OrganizationalUnits
			}
			if len(c.Usages) == 0 {
				return nil, fmt.Errorf("keys.%s.certificate.usages: required (server_auth and/or client_auth)", name)
			}
			for _, u := range c.Usages {
				v, ok := usages[strings.ToLower(u)]
				if !ok {
					return nil, fmt.Errorf("keys.%s.certificate.usages: unknown usage %q", name, u)
				}
				cs.Usages = append(cs.Usages, v)
			}
			if d := c.Validity.D(); d > 0 {
				cs.Validity = durationpb.New(d)
			}
			spec.Certificate = cs
		}
		p.Keys = append(p.Keys, spec)
	}
	for _, name := range sortedKeys(t.Files) {
		f := t.Files[name]
		key := "files." + name
		kind, ok := fileKinds[strings.ToLower(f.Kind)]
		if !ok {
			return nil, fmt.Errorf("%s.kind: unknown file kind %q", key, f.Kind)
		}
		fs := FileSpec{Path: f.Path, Kind: kind}
		if fs.Path == "" {
			fs.Path = name
		}
		if f.Mode != "" {
			m, err := strconv.ParseUint(strings.TrimPrefix(f.Mode, "0o"), 8, 32)
			if err != nil || m > 0o777 {
				return nil, fmt.Errorf("%s.mode: %q is not an octal permission", key, f.Mode)
			}
			fs.Mode = uint32(m)
		}
		switch {
		case strings.EqualFold(f.Kind, config.FileKindStorage):
			s.storageFile(ctx, key, f, data, &fs)
		case kind == nstancev1.FileKind_FILE_KIND_SECRET:
			s.secretFile(ctx, key, f, &fs)
		case kind == nstancev1.FileKind_FILE_KIND_CERTIFICATE:
			if _, ok := t.Keys[f.Key]; !ok {
				return nil, fmt.Errorf("%s.key: template has no key %q", key, f.Key)
			}
			fs.Key = f.Key
		case kind == nstancev1.FileKind_FILE_KIND_CA_BUNDLE && f.Content == "":
			fs.Content = s.CABundle
			if s.Bundle != nil {
				b, err := s.Bundle(ctx, ref.Tenant)
				if err != nil {
					return nil, fmt.Errorf("%s: the workload CA bundle of tenant %s: %w", key, ref.Tenant, err)
				}
				fs.Content = b
			}
		default:
			out, err := config.Render(key+".content", f.Content, data)
			if err != nil {
				return nil, err
			}
			fs.Content = []byte(out)
		}
		p.Files = append(p.Files, fs)
	}
	return p, nil
}

// dropEmpty removes names that rendered empty (e.g. {{ .Instance.IP6 }} on
// an instance without an IPv6 address).
func dropEmpty(in []string) []string {
	var out []string
	for _, v := range in {
		if strings.TrimSpace(v) != "" {
			out = append(out, v)
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
