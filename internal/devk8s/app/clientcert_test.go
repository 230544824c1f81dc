package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
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

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a client certificate and its key, PEM encoded.
func (ca *testCA) issue(t *testing.T, cn string, orgs ...string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

func (ca *testCA) tlsCert(t *testing.T, cn string, orgs ...string) tls.Certificate {
	t.Helper()
	c, k := ca.issue(t, cn, orgs...)
	pair, err := tls.X509KeyPair(c, k)
	require.NoError(t, err)
	return pair
}

func TestClientCertificatesOverTLS(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	dir := t.TempDir()
	ca := newTestCA(t)
	client, stranger := ca.tlsCert(t, "alice", "team-a"), newTestCA(t).tlsCert(t, "mallory", "team-a")
	caFile := filepath.Join(dir, "client-ca.crt")
	require.NoError(t, os.WriteFile(caFile, ca.pem, 0o600))

	_, err := Start(ctx, logr.Discard(), Config{Addr: "127.0.0.1:0", Dir: filepath.Join(dir, "plain"), ClientCAFile: caFile})
	require.ErrorContains(t, err, "needs TLS")

	run, err := Start(ctx, logr.Discard(), Config{Addr: "127.0.0.1:0", Dir: filepath.Join(dir, "data"), TLS: true, ClientCAFile: caFile})
	require.NoError(t, err)
	t.Cleanup(func() {
		cancel()
		require.NoError(t, run.Wait())
	})
	require.Contains(t, run.Usage(), "x509 client certificates (CA file "+caFile+")")
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(run.CAPEM))
	call := func(cert *tls.Certificate, token string) (int, string) {
		t.Helper()
		tc := &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
		if cert != nil {
			tc.Certificates = []tls.Certificate{*cert}
		}
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}, Timeout: 10 * time.Second}
		defer hc.CloseIdleConnections()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, run.URL+"/apis/authentication.k8s.io/v1/selfsubjectreviews",
			strings.NewReader(`{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := hc.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(body)
	}
	code, body := call(&client, "")
	require.Equal(t, http.StatusCreated, code, body)
	require.Contains(t, body, `"username":"alice"`)
	require.Contains(t, body, `"groups":["team-a","system:authenticated"]`)
	code, body = call(&stranger, "")
	require.Equal(t, http.StatusUnauthorized, code, "a certificate of another CA is refused, not anonymous: %s", body)
	code, body = call(nil, run.AdminToken)
	require.Equal(t, http.StatusCreated, code, body)
	require.Contains(t, body, `"username":"dev-k8s-admin"`)
	code, _ = call(nil, "")
	require.Equal(t, http.StatusUnauthorized, code)
}
