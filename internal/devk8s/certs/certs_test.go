package certs

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/clientcmd"
)

func TestServingCertificateVerifies(t *testing.T) {
	b, err := Generate([]string{"dev.example", "10.1.2.3"})
	require.NoError(t, err)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(b.CAPEM))
	block, _ := pem.Decode(b.CertPEM)
	cert, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	for _, host := range []string{"localhost", "127.0.0.1", "dev.example", "10.1.2.3"} {
		_, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: host})
		require.NoError(t, err, host)
	}
	_, err = cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "other.example"})
	require.Error(t, err)
	_, err = b.TLSConfig()
	require.NoError(t, err)
}

func TestLoadOrCreate(t *testing.T) {
	dir := t.TempDir()
	first, err := LoadOrCreate(dir, nil)
	require.NoError(t, err)
	again, err := LoadOrCreate(dir, nil)
	require.NoError(t, err)
	require.Equal(t, first.CAPEM, again.CAPEM, "kept across restarts")

	// A damaged key is replaced rather than served.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "server.key"), []byte("torn"), 0o600))
	fresh, err := LoadOrCreate(dir, nil)
	require.NoError(t, err)
	require.NotEqual(t, first.CAPEM, fresh.CAPEM)
	_, err = fresh.TLSConfig()
	require.NoError(t, err)

	// A host the stored certificate does not cover (--tls-san) reissues it.
	kept, err := LoadOrCreate(dir, []string{"localhost", "127.0.0.1"})
	require.NoError(t, err)
	require.Equal(t, fresh.CAPEM, kept.CAPEM, "hosts already covered keep the bundle")
	widened, err := LoadOrCreate(dir, []string{"10.9.8.7", "dev.example"})
	require.NoError(t, err)
	require.NotEqual(t, fresh.CAPEM, widened.CAPEM)
	require.True(t, widened.covers([]string{"10.9.8.7", "dev.example", "127.0.0.1"}))
}

func TestWriteKubeconfig(t *testing.T) {
	b, err := Generate(nil)
	require.NoError(t, err)
	cases := []struct {
		name, server string
		ca           []byte
	}{
		{name: "tls", server: "https://127.0.0.1:6443", ca: b.CAPEM},
		{name: "plain", server: "http://127.0.0.1:6443"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "sub", "kubeconfig")
			require.NoError(t, WriteKubeconfig(p, tc.server, tc.ca, "secret-token"))
			info, err := os.Stat(p)
			require.NoError(t, err)
			require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), "the kubeconfig holds a credential")
			cfg, err := clientcmd.BuildConfigFromFlags("", p)
			require.NoError(t, err)
			require.Equal(t, tc.server, cfg.Host)
			require.Equal(t, tc.ca, cfg.CAData)
			if tc.ca != nil {
				// client-go sends the token only over TLS.
				require.Equal(t, "secret-token", cfg.BearerToken)
			}
		})
	}
}
