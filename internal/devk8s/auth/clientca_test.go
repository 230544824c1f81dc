package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
)

// testCA signs client certificates.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (ca *testCA) issue(t *testing.T, cn string, orgs []string, notBefore, notAfter time.Time) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return cert
}

func certRequest(path, token string, cert *x509.Certificate) *http.Request {
	r := request(path, token)
	r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}
	return r
}

func writeCA(t *testing.T, path string, pems ...[]byte) {
	t.Helper()
	var all []byte
	for _, p := range pems {
		all = append(all, p...)
	}
	// Write and rename, as a stack writing a CA atomically does.
	tmp := path + ".tmp"
	require.NoError(t, os.WriteFile(tmp, all, 0o600))
	require.NoError(t, os.Rename(tmp, path))
}

func TestClientCertificates(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	caFile := filepath.Join(dir, "node-ca.crt")
	nodeCA, otherCA := newTestCA(t, "node-ca"), newTestCA(t, "other-ca")
	writeCA(t, caFile, nodeCA.pem)
	a, err := New(ctx, Options{StateDir: filepath.Join(dir, "state"), ClientCAFile: caFile, Log: logr.Discard()})
	require.NoError(t, err)
	require.Contains(t, a.Methods(), "x509 client certificates (CA file "+caFile+")")
	now := time.Now()

	good := nodeCA.issue(t, "system:node:a", []string{"system:nodes"}, now.Add(-time.Minute), now.Add(time.Hour))
	u, err := a.Authenticate(certRequest("/api", "", good))
	require.NoError(t, err)
	require.Equal(t, "system:node:a", u.GetName())
	require.Equal(t, []string{"system:nodes", "system:authenticated"}, u.GetGroups())
	require.Contains(t, u.GetExtra()["authentication.kubernetes.io/credential-id"][0], "X509SHA256=")

	foreign := otherCA.issue(t, "system:node:a", []string{"system:nodes"}, now.Add(-time.Minute), now.Add(time.Hour))
	expired := nodeCA.issue(t, "system:node:a", []string{"system:nodes"}, now.Add(-2*time.Hour), now.Add(-time.Hour))
	for name, cert := range map[string]*x509.Certificate{"another CA": foreign, "expired": expired} {
		_, err := a.Authenticate(certRequest("/api", "", cert))
		require.Error(t, err, name)
		_, err = a.Authenticate(certRequest("/healthz", "", cert))
		require.Error(t, err, "%s: a bad certificate is not anonymous, even on /healthz", name)
		// As kube-apiserver: a good token next to a bad certificate wins.
		u, err := a.Authenticate(certRequest("/api", a.AdminToken(), cert))
		require.NoError(t, err, name)
		require.Equal(t, AdminUser, u.GetName())
	}
	u, err = a.Authenticate(request("/api", a.AdminToken()))
	require.NoError(t, err, "tokens still work without a certificate")
	require.Equal(t, AdminUser, u.GetName())
	u, err = a.Authenticate(certRequest("/api", a.AdminToken(), good))
	require.NoError(t, err)
	require.Equal(t, "system:node:a", u.GetName(), "the certificate is tried first")

	// The file is rewritten with the other CA: its certificates are
	// accepted and the first CA's no longer are.
	writeCA(t, caFile, otherCA.pem)
	require.Eventually(t, func() bool {
		_, err := a.Authenticate(certRequest("/api", "", foreign))
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "a rewritten CA file is picked up")
	_, err = a.Authenticate(certRequest("/api", "", good))
	require.Error(t, err)
}

func TestClientCAFileWrittenLater(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	caFile := filepath.Join(dir, "later", "node-ca.crt")
	a, err := New(ctx, Options{StateDir: filepath.Join(dir, "state"), ClientCAFile: caFile, Log: logr.Discard(), ClientCAPoll: 10 * time.Millisecond})
	require.NoError(t, err)
	ca := newTestCA(t, "node-ca")
	cert := ca.issue(t, "system:node:a", []string{"system:nodes"}, time.Now().Add(-time.Minute), time.Now().Add(time.Hour))
	_, err = a.Authenticate(certRequest("/api", "", cert))
	require.Error(t, err, "no CA yet: the certificate does not authenticate")
	require.NoError(t, os.MkdirAll(filepath.Dir(caFile), 0o700))
	require.NoError(t, os.WriteFile(caFile, []byte("not yet"), 0o600))
	time.Sleep(50 * time.Millisecond)
	writeCA(t, caFile, ca.pem)
	require.Eventually(t, func() bool {
		u, err := a.Authenticate(certRequest("/api", "", cert))
		return err == nil && u.GetName() == "system:node:a"
	}, 10*time.Second, 20*time.Millisecond)

	// A file that exists but is not a CA bundle is refused at start.
	_, err = New(ctx, Options{StateDir: filepath.Join(dir, "state"), ClientCAFile: filepath.Join(dir, "state", adminTokenFile)})
	require.ErrorContains(t, err, "client CA file")
}
