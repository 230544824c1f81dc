package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCheckSubject(t *testing.T) {
	deny := []string{"cluster-admins"}
	cases := []struct {
		name, cn string
		orgs     []string
		node     string
		refused  string // substring of the error; "" means allowed
	}{
		{"kubelet client", "system:node:web-1a2b3c4d", []string{"system:nodes"}, "web-1a2b3c4d", ""},
		{"plain service", "api.example.com", []string{"acme"}, "web-1", ""},
		{"no subject groups", "worker", nil, "", ""},
		{"masters", "web-1", []string{"system:masters"}, "web-1", "system:masters is never issued"},
		{"masters other case", "web-1", []string{"System:Masters"}, "web-1", "never issued"},
		{"masters padded", "web-1", []string{" system:masters"}, "web-1", "never issued"},
		{"masters beside nodes", "system:node:web-1", []string{"system:nodes", "system:masters"}, "web-1", "never issued"},
		{"denied group", "web-1", []string{"cluster-admins"}, "web-1", "denied_groups"},
		{"other reserved group", "web-1", []string{"system:kube-controller-manager"}, "web-1", "reserved Kubernetes groups"},
		{"other node's name", "system:node:web-2", []string{"system:nodes"}, "web-1", `must be "system:node:web-1"`},
		{"node group with plain CN", "web-1", []string{"system:nodes"}, "web-1", "node identity must be"},
		{"node CN without group", "system:node:web-2", nil, "web-1", "node identity must be"},
		{"node identity outside an instance", "system:node:web-1", []string{"system:nodes"}, "", "only issued to an instance"},
		{"reserved user", "system:kube-scheduler", nil, "web-1", "reserved Kubernetes user names"},
		{"reserved user other case", "SYSTEM:admin", nil, "web-1", "reserved Kubernetes user names"},
		{"empty organization", "web-1", []string{""}, "web-1", "empty or padded"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckSubject(tc.cn, tc.orgs, deny, tc.node)
			if tc.refused == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.refused)
		})
	}
}

// importedCA makes a CA as kubeadm does (RSA, PKCS#1 key on disk).
func importedCA(t *testing.T) (*CA, []byte, []byte) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	signer, err := ParseImportedKeyPEM(keyPEM)
	require.NoError(t, err)
	pk8, err := MarshalPrivateKeyPEM(signer)
	require.NoError(t, err)
	ca, err := LoadCA(certPEM, pk8)
	require.NoError(t, err)
	return ca, certPEM, keyPEM
}

func TestIssueImported(t *testing.T) {
	ca, _, _ := importedCA(t)
	require.NoError(t, CheckImportable(ca, time.Now()))
	nodeKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	pol := ImportedPolicy{Names: policy, DeniedGroups: []string{"cluster-admins"}, NodeName: "web-1"}
	now := time.Now()

	cert, _, err := ca.IssueImported(SubjectRequest{
		CommonName: "system:node:web-1", Organization: []string{"system:nodes"},
		DNSNames: []string{"web-1"}, IPs: []net.IP{net.ParseIP("10.1.2.3")},
		Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, PublicKey: &nodeKey.PublicKey, Validity: time.Hour,
	}, pol, now)
	require.NoError(t, err)
	require.Equal(t, "system:node:web-1", cert.Subject.CommonName)
	require.Equal(t, []string{"system:nodes"}, cert.Subject.Organization)
	require.False(t, cert.IsCA)
	require.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, cert.ExtKeyUsage)
	_, err = cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, CurrentTime: now})
	require.NoError(t, err, "the certificate chains to the imported CA")

	// Lifetime is capped by the CA's.
	long, _, err := ca.IssueImported(SubjectRequest{CommonName: "svc", Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		PublicKey: &nodeKey.PublicKey, Validity: 1000 * time.Hour}, pol, now)
	require.NoError(t, err)
	require.False(t, long.NotAfter.After(ca.Cert.NotAfter))

	refused := map[string]SubjectRequest{
		"masters":         {CommonName: "x", Organization: []string{"system:masters"}},
		"another node":    {CommonName: "system:node:web-2", Organization: []string{"system:nodes"}},
		"server name SAN": {CommonName: "svc", DNSNames: []string{"nstance.example.com"}},
		"server address":  {CommonName: "svc", IPs: []net.IP{net.ParseIP("10.0.0.5")}},
		"trust domain":    {CommonName: "svc", URIs: []*url.URL{mustURL(t, "spiffe://c1/tenant/a/agent/x")}},
		"no usages":       {CommonName: "svc", Usages: []x509.ExtKeyUsage{}},
		"code signing":    {CommonName: "svc", Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning}},
	}
	for name, req := range refused {
		if req.Usages == nil {
			req.Usages = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		}
		req.PublicKey, req.Validity = &nodeKey.PublicKey, time.Hour
		_, _, err := ca.IssueImported(req, pol, now)
		require.Error(t, err, name)
	}

	// Nstance's own cluster CA is never an imported signer, nor importable.
	cluster, err := GenerateCA("c1", time.Hour, now)
	require.NoError(t, err)
	_, _, err = cluster.IssueImported(SubjectRequest{CommonName: "svc", Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		PublicKey: &nodeKey.PublicKey, Validity: time.Hour}, pol, now)
	require.ErrorContains(t, err, "cluster CA")
	require.ErrorContains(t, CheckImportable(cluster, now), "trust domain")
	require.ErrorContains(t, CheckImportable(ca, now.Add(48*time.Hour)), "expired")
}

func TestParseImportedKeyPEM(t *testing.T) {
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	der, err := x509.MarshalECPrivateKey(ec)
	require.NoError(t, err)
	withParams := append(pem.EncodeToMemory(&pem.Block{Type: "EC PARAMETERS", Bytes: []byte{6, 8, 42, 134, 72, 206, 61, 3, 1, 7}}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})...)
	k, err := ParseImportedKeyPEM(withParams)
	require.NoError(t, err)
	require.True(t, ec.PublicKey.Equal(k.Public()))
	_, err = ParseImportedKeyPEM([]byte("not a key"))
	require.ErrorContains(t, err, "no PRIVATE KEY")
	_, err = ParseImportedKeyPEM(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: []byte{1, 2}}))
	require.ErrorContains(t, err, "parsing RSA private key")
}
