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

// issuePair makes a self-signed CA and a client certificate signed by it.
func issuePair(t *testing.T, cn string, orgs ...string) (caPEM []byte, client tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func TestClientCertificatesOverTLS(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	dir := t.TempDir()
	caPEM, client := issuePair(t, "alice", "team-a")
	_, stranger := issuePair(t, "mallory", "team-a")
	caFile := filepath.Join(dir, "client-ca.crt")
	require.NoError(t, os.WriteFile(caFile, caPEM, 0o600))

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
