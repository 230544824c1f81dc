package agentapi_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/agentapi"
	"github.com/nstance-dev/nstance/internal/server/authz"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
	"github.com/nstance-dev/nstance/test/agent/agenttest"
)

func pubPEM(t *testing.T, pub any) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	require.NoError(t, err)
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

func agentCtx(id string) context.Context {
	return authz.WithIdentity(context.Background(), pki.Identity{ClusterID: agenttest.ClusterID, Tenant: agenttest.Tenant, Role: pki.RoleAgent, ClientID: id, Shard: agenttest.ShardID, Group: "g"})
}

func newShard(t *testing.T, tmpl config.Template) *agenttest.Shard {
	t.Helper()
	s, err := agenttest.New(logr.Discard())
	require.NoError(t, err)
	require.NoError(t, s.Start())
	t.Cleanup(s.Stop)
	_, err = s.Add(agenttest.Instance{ID: "i-1", Group: "g", Template: tmpl}, t.TempDir())
	require.NoError(t, err)
	return s
}

func TestSubmitPublicKeys(t *testing.T) {
	tmpl := config.Template{Keys: map[string]config.TemplateKey{
		"ed":  {Type: "ed25519", Certificate: &config.TemplateCertificate{CommonName: "{{ .InstanceID }}", Usages: []string{"server_auth"}, DNSNames: []string{"a.example"}}},
		"ec":  {Type: "ecdsa-p256"},
		"ec2": {Type: "ecdsa-p256"},
	}, Files: map[string]config.TemplateFile{"ed.crt": {Kind: "certificate", Key: "ed"}}}
	s := newShard(t, tmpl)
	// Before any key is submitted the certificate file is pending: the agent keeps what it has there.
	d, err := s.Agent.Delivery(agentCtx("i-1"), agentapi.Ref{InstanceID: "i-1", Tenant: agenttest.Tenant})
	require.NoError(t, err)
	require.Empty(t, d.GetFiles())
	require.Equal(t, []string{"ed.crt"}, d.GetPendingPaths())
	edPub, _, _ := ed25519.GenerateKey(rand.Reader)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	ed := pubPEM(t, edPub)
	ec := pubPEM(t, &ecKey.PublicKey)

	resp, err := s.Agent.SubmitPublicKeys(agentCtx("i-1"), &nstancev1.SubmitPublicKeysRequest{Keys: []*nstancev1.PublicKey{
		{Name: "ed", Type: nstancev1.KeyType_KEY_TYPE_ED25519, PublicKeyPem: ed},
		{Name: "ec", Type: nstancev1.KeyType_KEY_TYPE_ECDSA_P256, PublicKeyPem: ec},
		{Name: "ec", Type: nstancev1.KeyType_KEY_TYPE_ECDSA_P256, PublicKeyPem: ec},
		{Name: "nope", Type: nstancev1.KeyType_KEY_TYPE_ED25519, PublicKeyPem: ed},
		{Name: "ec2", Type: nstancev1.KeyType_KEY_TYPE_ED25519, PublicKeyPem: ed},
		{Name: "ec2", Type: nstancev1.KeyType_KEY_TYPE_ECDSA_P256, PublicKeyPem: pubPEM(t, &p384.PublicKey)},
	}})
	require.NoError(t, err)
	require.Equal(t, []string{"ed", "ec"}, resp.Accepted)
	reasons := map[string]string{}
	for _, r := range resp.Rejected {
		reasons[r.Name] += r.Reason + ";"
	}
	require.Contains(t, reasons["ec"], "submitted twice")
	require.Contains(t, reasons["nope"], "asks for no key")
	require.Contains(t, reasons["ec2"], "does not match the requested")
	require.Contains(t, reasons["ec2"], "public key is KEY_TYPE_ECDSA_P384")

	resp, err = s.Agent.SubmitPublicKeys(agentCtx("i-1"), &nstancev1.SubmitPublicKeysRequest{Keys: []*nstancev1.PublicKey{
		{Name: "ec2", Type: nstancev1.KeyType_KEY_TYPE_ECDSA_P256, PublicKeyPem: "garbage"},
	}})
	require.NoError(t, err)
	require.Contains(t, resp.Rejected[0].Reason, "no PUBLIC KEY PEM block")

	// The certificate asked for by the template was issued and is delivered.
	files, hash, err := s.Agent.Files(agentCtx("i-1"), agentapi.Ref{InstanceID: "i-1", Tenant: agenttest.Tenant})
	require.NoError(t, err)
	require.Len(t, files, 1)
	require.NotEmpty(t, hash)
	cert, err := pki.ParseCertificatePEM(files[0].Content)
	require.NoError(t, err)
	require.Equal(t, "i-1", cert.Subject.CommonName)
	require.Equal(t, []string{"a.example"}, cert.DNSNames)
	require.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, cert.ExtKeyUsage)
	require.True(t, edPub.Equal(cert.PublicKey))
	_, err = cert.Verify(x509.VerifyOptions{Roots: s.WorkloadCA.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	require.NoError(t, err)
	d, err = s.Agent.Delivery(agentCtx("i-1"), agentapi.Ref{InstanceID: "i-1", Tenant: agenttest.Tenant})
	require.NoError(t, err)
	require.Empty(t, d.GetPendingPaths())

	// Submitting the same key again keeps the certificate (same hash).
	_, err = s.Agent.SubmitPublicKeys(agentCtx("i-1"), &nstancev1.SubmitPublicKeysRequest{Keys: []*nstancev1.PublicKey{{Name: "ed", Type: nstancev1.KeyType_KEY_TYPE_ED25519, PublicKeyPem: ed}}})
	require.NoError(t, err)
	_, hash2, err := s.Agent.Files(agentCtx("i-1"), agentapi.Ref{InstanceID: "i-1", Tenant: agenttest.Tenant})
	require.NoError(t, err)
	require.Equal(t, hash, hash2)

	// A new key for the name drops the old certificate and issues a new one.
	edPub2, _, _ := ed25519.GenerateKey(rand.Reader)
	_, err = s.Agent.SubmitPublicKeys(agentCtx("i-1"), &nstancev1.SubmitPublicKeysRequest{Keys: []*nstancev1.PublicKey{{Name: "ed", Type: nstancev1.KeyType_KEY_TYPE_ED25519, PublicKeyPem: pubPEM(t, edPub2)}}})
	require.NoError(t, err)
	files, hash3, err := s.Agent.Files(agentCtx("i-1"), agentapi.Ref{InstanceID: "i-1", Tenant: agenttest.Tenant})
	require.NoError(t, err)
	require.NotEqual(t, hash, hash3)
	cert, err = pki.ParseCertificatePEM(files[0].Content)
	require.NoError(t, err)
	require.True(t, edPub2.Equal(cert.PublicKey))

	many := make([]*nstancev1.PublicKey, 65)
	for i := range many {
		many[i] = &nstancev1.PublicKey{Name: "x"}
	}
	_, err = s.Agent.SubmitPublicKeys(agentCtx("i-1"), &nstancev1.SubmitPublicKeysRequest{Keys: many})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
}

func TestCallerChecks(t *testing.T) {
	s := newShard(t, config.Template{})
	_, err := s.Agent.SubmitPublicKeys(context.Background(), &nstancev1.SubmitPublicKeysRequest{})
	require.Equal(t, codes.Unauthenticated, status.Code(err))
	op := authz.WithIdentity(context.Background(), pki.Identity{ClusterID: agenttest.ClusterID, Tenant: "t", Role: pki.RoleOperator, ClientID: "op"})
	_, err = s.Agent.SubmitPublicKeys(op, &nstancev1.SubmitPublicKeysRequest{})
	require.Equal(t, codes.PermissionDenied, status.Code(err))
	_, err = s.Agent.SubmitPublicKeys(agentCtx("ghost"), &nstancev1.SubmitPublicKeysRequest{})
	require.Equal(t, codes.NotFound, status.Code(err))
}

func TestTemplateSourceErrors(t *testing.T) {
	lookup := func(tmpl config.Template) func(context.Context, agentapi.Ref) (*agentapi.TemplateInput, error) {
		return func(context.Context, agentapi.Ref) (*agentapi.TemplateInput, error) {
			return &agentapi.TemplateInput{Template: tmpl, Data: agentapi.TemplateData{InstanceID: "i", Vars: map[string]string{"a": "1"}}}, nil
		}
	}
	for _, tc := range []struct {
		name string
		tmpl config.Template
		want string
	}{
		{"key type", config.Template{Keys: map[string]config.TemplateKey{"k": {Type: "dsa"}}}, `keys.k.type: unknown key type "dsa"`},
		{"usage", config.Template{Keys: map[string]config.TemplateKey{"k": {Type: "ed25519", Certificate: &config.TemplateCertificate{Usages: []string{"code_signing"}}}}}, "keys.k.certificate.usages"},
		{"kind", config.Template{Files: map[string]config.TemplateFile{"f": {Kind: "binary"}}}, `files.f.kind`},
		{"mode", config.Template{Files: map[string]config.TemplateFile{"f": {Kind: "string", Mode: "0999"}}}, "files.f.mode"},
		{"missing var", config.Template{Files: map[string]config.TemplateFile{"f": {Kind: "env", Content: "A={{ .Vars.missing }}"}}}, "files.f.content"},
		{"bad template", config.Template{Files: map[string]config.TemplateFile{"f": {Kind: "env", Content: "A={{ .Vars.a "}}}, "files.f.content"},
		{"cert key", config.Template{Files: map[string]config.TemplateFile{"f": {Kind: "certificate", Key: "k"}}}, `files.f.key: template has no key "k"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := (&agentapi.TemplateSource{Lookup: lookup(tc.tmpl)}).Plan(context.Background(), agentapi.Ref{})
			require.ErrorContains(t, err, tc.want)
		})
	}
	p, err := (&agentapi.TemplateSource{Lookup: lookup(config.Template{Files: map[string]config.TemplateFile{
		"f": {Kind: "env", Content: "A={{ .Vars.a }}\nI={{ .InstanceID }}\n", Mode: "0600"},
		"s": {Kind: "secret", Secret: "tok"},
	}}), Secret: func(_ context.Context, f config.TemplateFile) (agentapi.Fetched, error) {
		return agentapi.Fetched{Content: []byte("secret-" + f.Secret)}, nil
	}}).Plan(context.Background(), agentapi.Ref{})
	require.NoError(t, err)
	require.Equal(t, []agentapi.FileSpec{
		{Path: "f", Kind: nstancev1.FileKind_FILE_KIND_ENV, Mode: 0o600, Content: []byte("A=1\nI=i\n")},
		{Path: "s", Kind: nstancev1.FileKind_FILE_KIND_SECRET, Mode: 0o600, Content: []byte("secret-tok")},
	}, p.Files)

	// Without a secret store the plan still succeeds: that file is left out with its reason.
	p, err = (&agentapi.TemplateSource{Lookup: lookup(config.Template{Files: map[string]config.TemplateFile{
		"s": {Kind: "secret", Secret: "tok"},
	}})}).Plan(context.Background(), agentapi.Ref{})
	require.NoError(t, err)
	require.ErrorContains(t, p.Files[0].Err, "files.s (s): no secret store configured")
}

func TestHashFiles(t *testing.T) {
	a := &nstancev1.DeliveredFile{Path: "a", Kind: nstancev1.FileKind_FILE_KIND_STRING, Mode: 0o644, Sha256: "11"}
	b := &nstancev1.DeliveredFile{Path: "b", Kind: nstancev1.FileKind_FILE_KIND_STRING, Mode: 0o644, Sha256: "22"}
	h := agentapi.HashFiles([]*nstancev1.DeliveredFile{a, b})
	require.Equal(t, h, agentapi.HashFiles([]*nstancev1.DeliveredFile{b, a}), "order does not matter")
	b2 := &nstancev1.DeliveredFile{Path: "b", Kind: nstancev1.FileKind_FILE_KIND_STRING, Mode: 0o600, Sha256: "22"}
	require.NotEqual(t, h, agentapi.HashFiles([]*nstancev1.DeliveredFile{a, b2}), "mode matters")
	require.NotEqual(t, h, agentapi.HashFiles([]*nstancev1.DeliveredFile{a}))
}

func TestWorkloadSigner(t *testing.T) {
	wca, err := pki.GenerateWorkloadCA("c", time.Hour, time.Now())
	require.NoError(t, err)
	policy := func() pki.WorkloadPolicy {
		return pki.WorkloadPolicy{TrustDomain: "c", ServerHosts: []string{"127.0.0.1", "nstance.example.com"}}
	}
	sg := &agentapi.WorkloadSigner{CA: wca, MaxValidity: time.Hour, Policy: policy}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	ref := agentapi.Ref{InstanceID: "i", Tenant: "t"}
	both := []nstancev1.CertificateUsage{nstancev1.CertificateUsage_CERTIFICATE_USAGE_SERVER_AUTH, nstancev1.CertificateUsage_CERTIFICATE_USAGE_CLIENT_AUTH}
	for _, tc := range []struct {
		spec *nstancev1.CertificateSpec
		want string
	}{
		{&nstancev1.CertificateSpec{Usages: both, IpAddresses: []string{"not-ip"}}, "not an IP"},
		{&nstancev1.CertificateSpec{Usages: both, Uris: []string{"no-scheme"}}, "absolute URI"},
		{&nstancev1.CertificateSpec{Usages: []nstancev1.CertificateUsage{99}}, "unsupported usage"},
		{&nstancev1.CertificateSpec{Usages: both, Uris: []string{"spiffe://c/tenant/t/operator/op"}}, "trust domain"},
		{&nstancev1.CertificateSpec{Usages: both, DnsNames: []string{"nstance.example.com"}}, "name of the nstance-server"},
		{&nstancev1.CertificateSpec{Usages: both, IpAddresses: []string{"127.0.0.1"}}, "address of the nstance-server"},
		{&nstancev1.CertificateSpec{}, "lists no usages"},
	} {
		_, _, _, err := sg.Sign(context.Background(), ref, tc.spec, pub)
		require.ErrorContains(t, err, tc.want)
	}
	certPEM, nb, na, err := sg.Sign(context.Background(), ref, &nstancev1.CertificateSpec{Usages: both}, pub)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(certPEM), "-----BEGIN CERTIFICATE-----"))
	require.InDelta(t, (time.Hour + time.Minute).Seconds(), na.Sub(nb).Seconds(), 1)
	cert, err := pki.ParseCertificatePEM(certPEM)
	require.NoError(t, err)
	require.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, cert.ExtKeyUsage, "exactly the usages asked for")
	require.Equal(t, "i", cert.Subject.CommonName)
	require.Empty(t, cert.URIs)

	// The cluster CA is refused as a workload signer.
	ca, err := pki.GenerateCA("c", time.Hour, time.Now())
	require.NoError(t, err)
	_, _, _, err = (&agentapi.WorkloadSigner{CA: ca, MaxValidity: time.Hour, Policy: policy}).Sign(context.Background(), ref, &nstancev1.CertificateSpec{Usages: both}, pub)
	require.ErrorContains(t, err, "cluster CA")
	_, _, _, err = (&agentapi.WorkloadSigner{CA: wca, MaxValidity: time.Hour}).Sign(context.Background(), ref, &nstancev1.CertificateSpec{}, pub)
	require.ErrorContains(t, err, "policy are required")
}

// Each tenant's certificates come from its own workload CA and each
// tenant's ca_bundle is its own: tenant A's certificate for tenant B's name
// does not verify against tenant B's bundle.
func TestWorkloadCAPerTenant(t *testing.T) {
	cas := map[string]*pki.CA{}
	for _, tenant := range []string{"acme", "globex"} {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		require.NoError(t, err)
		cas[tenant], err = pki.SelfSignTenantWorkloadCA("c", tenant, priv, time.Hour, time.Now())
		require.NoError(t, err)
	}
	byTenant := func(_ context.Context, tenant string) (*pki.CA, error) {
		if ca, ok := cas[tenant]; ok {
			return ca, nil
		}
		return nil, errors.New("no such tenant")
	}
	policy := func() pki.WorkloadPolicy { return pki.WorkloadPolicy{TrustDomain: "c"} }
	sg := &agentapi.WorkloadSigner{CAs: byTenant, CA: cas["globex"], MaxValidity: time.Hour, Policy: policy}
	src := &agentapi.TemplateSource{
		Lookup: func(_ context.Context, ref agentapi.Ref) (*agentapi.TemplateInput, error) {
			return &agentapi.TemplateInput{Template: config.Template{Files: map[string]config.TemplateFile{"ca.crt": {Kind: "ca_bundle"}}},
				Data: agentapi.TemplateData{InstanceID: ref.InstanceID, Tenant: ref.Tenant}}, nil
		},
		Bundle: func(ctx context.Context, tenant string) ([]byte, error) {
			ca, err := byTenant(ctx, tenant)
			if err != nil {
				return nil, err
			}
			return ca.CertPEM, nil
		},
		CABundle: cas["globex"].CertPEM, // ignored: Bundle is set
	}
	spec := &nstancev1.CertificateSpec{DnsNames: []string{"svc.globex.test"}, Usages: []nstancev1.CertificateUsage{nstancev1.CertificateUsage_CERTIFICATE_USAGE_SERVER_AUTH}}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	issue := func(tenant string) *x509.Certificate {
		certPEM, _, _, err := sg.Sign(context.Background(), agentapi.Ref{InstanceID: "i-" + tenant, Tenant: tenant}, spec, pub)
		require.NoError(t, err)
		cert, err := pki.ParseCertificatePEM(certPEM)
		require.NoError(t, err)
		return cert
	}
	bundleOf := func(tenant string) *x509.CertPool {
		p, err := src.Plan(context.Background(), agentapi.Ref{InstanceID: "i-" + tenant, Tenant: tenant})
		require.NoError(t, err)
		require.Len(t, p.Files, 1)
		pool := x509.NewCertPool()
		require.True(t, pool.AppendCertsFromPEM(p.Files[0].Content))
		return pool
	}
	opts := x509.VerifyOptions{Roots: bundleOf("globex"), DNSName: "svc.globex.test"}
	_, err := issue("globex").Verify(opts)
	require.NoError(t, err, "tenant B's own certificate verifies against its bundle")
	_, err = issue("acme").Verify(opts)
	require.Error(t, err, "tenant A's certificate for tenant B's name does not")
	_, err = issue("acme").Verify(x509.VerifyOptions{Roots: bundleOf("acme"), DNSName: "svc.globex.test"})
	require.NoError(t, err, "it verifies only for tenant A's own instances")

	_, _, _, err = sg.Sign(context.Background(), agentapi.Ref{InstanceID: "i"}, spec, pub)
	require.ErrorContains(t, err, "has no tenant")
	_, _, _, err = sg.Sign(context.Background(), agentapi.Ref{InstanceID: "i", Tenant: "initech"}, spec, pub)
	require.ErrorContains(t, err, "the workload CA of tenant initech")
	_, err = src.Plan(context.Background(), agentapi.Ref{InstanceID: "i", Tenant: "initech"})
	require.ErrorContains(t, err, "files.ca.crt: the workload CA bundle of tenant initech")
}
