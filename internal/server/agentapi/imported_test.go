package agentapi_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/agentapi"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// TestImportedSigner: certificates of an imported CA are routed by spec.ca,
// bound to the requesting instance's own node name, refused for system:masters,
// denied groups and instances that may no longer get certificates.
func TestImportedSigner(t *testing.T) {
	ctx := context.Background()
	nodeCA, err := pki.GenerateWorkloadCA("someone-else", time.Hour, time.Now()) // any CA without a trust domain
	require.NoError(t, err)
	cluster, err := pki.GenerateCA("c", time.Hour, time.Now())
	require.NoError(t, err)
	cas := map[string]*pki.CA{"kubernetes": nodeCA, "sneaky": cluster}
	dead := map[string]bool{"gone": true}
	imp := &agentapi.ImportedSigner{
		CA: func(_ context.Context, name string) (*pki.CA, error) {
			if ca, ok := cas[name]; ok {
				return ca, nil
			}
			return nil, errors.New("no CA imported under this name")
		},
		MaxValidity: time.Hour,
		Policy: func() pki.WorkloadPolicy {
			return pki.WorkloadPolicy{TrustDomain: "c", ServerHosts: []string{"127.0.0.1"}}
		},
		DeniedGroups: func() []string { return []string{pki.GroupMasters, "cluster-admins"} },
		Alive: func(_ context.Context, ref agentapi.Ref) error {
			if dead[ref.InstanceID] {
				return errors.New("instance gone is deleting: no new certificates")
			}
			return nil
		},
	}
	wca, err := pki.GenerateWorkloadCA("c", time.Hour, time.Now())
	require.NoError(t, err)
	signer := agentapi.CASigners{Imported: imp, Workload: &agentapi.WorkloadSigner{CA: wca, MaxValidity: time.Hour,
		Policy: func() pki.WorkloadPolicy { return pki.WorkloadPolicy{TrustDomain: "c"} }}}
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	client := []nstancev1.CertificateUsage{nstancev1.CertificateUsage_CERTIFICATE_USAGE_CLIENT_AUTH}
	kubelet := func(cn string, orgs ...string) *nstancev1.CertificateSpec {
		return &nstancev1.CertificateSpec{Ca: "kubernetes", CommonName: cn, Organization: orgs, Usages: client}
	}
	ref := agentapi.Ref{InstanceID: "web-1", Tenant: "acme"}

	certPEM, _, _, err := signer.Sign(ctx, ref, kubelet("system:node:web-1", "system:nodes"), pub)
	require.NoError(t, err)
	cert, err := pki.ParseCertificatePEM(certPEM)
	require.NoError(t, err)
	require.Equal(t, "system:node:web-1", cert.Subject.CommonName)
	require.Equal(t, []string{"system:nodes"}, cert.Subject.Organization)
	require.NoError(t, cert.CheckSignatureFrom(nodeCA.Cert), "signed by the imported CA")

	// A spec without ca goes to the workload CA, with the tenant as O.
	certPEM, _, _, err = signer.Sign(ctx, ref, &nstancev1.CertificateSpec{CommonName: "svc", Usages: client}, pub)
	require.NoError(t, err)
	cert, err = pki.ParseCertificatePEM(certPEM)
	require.NoError(t, err)
	require.NoError(t, cert.CheckSignatureFrom(wca.Cert))
	require.Equal(t, []string{"acme"}, cert.Subject.Organization)

	for name, tc := range map[string]struct {
		ref  agentapi.Ref
		spec *nstancev1.CertificateSpec
		want string
	}{
		"another node's identity": {ref, kubelet("system:node:web-2", "system:nodes"), `must be "system:node:web-1"`},
		"system:masters":          {ref, kubelet("web-1", "system:masters"), "never issued"},
		"denied group":            {ref, kubelet("web-1", "cluster-admins"), "denied_groups"},
		"deleted instance":        {agentapi.Ref{InstanceID: "gone", Tenant: "acme"}, kubelet("system:node:gone", "system:nodes"), "no new certificates"},
		"unknown CA":              {ref, &nstancev1.CertificateSpec{Ca: "nope", CommonName: "x", Usages: client}, "no CA imported"},
		"the cluster CA":          {ref, &nstancev1.CertificateSpec{Ca: "sneaky", CommonName: "x", Usages: client}, "cluster CA"},
		"no usages":               {ref, &nstancev1.CertificateSpec{Ca: "kubernetes", CommonName: "x"}, "no usages"},
	} {
		_, _, _, err := signer.Sign(ctx, tc.ref, tc.spec, pub)
		require.ErrorContains(t, err, tc.want, name)
	}
	_, _, _, err = agentapi.CASigners{Workload: signer.Workload}.Sign(ctx, ref, kubelet("system:node:web-1", "system:nodes"), pub)
	require.ErrorContains(t, err, "no imported CAs are configured")
}
