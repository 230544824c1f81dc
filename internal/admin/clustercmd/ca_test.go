package clustercmd_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/importedca"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/dirstore"
)

// The admin imports a kubeadm CA (RSA, PKCS#1 key), lists it, cannot
// import Nstance's own CA, creates one for a dev cluster, and deletes them.
func TestClusterCAImportCreateListDelete(t *testing.T) {
	t.Setenv("NSTANCE_ENCRYPTION_KEY", encKey)
	dir := t.TempDir()
	st := []string{"--storage", "file", "--storage-dir", dir}
	run := func(args ...string) (string, error) {
		return runAdmin(t, append(append([]string{"cluster", "ca"}, args...), st...)...)
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "kubernetes"}, NotBefore: now.Add(-time.Hour),
		NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	files := t.TempDir()
	certFile, keyFile := filepath.Join(files, "ca.crt"), filepath.Join(files, "ca.key")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600))

	out, err := run("import", "--name", "kubernetes", "--cert", certFile, "--key", keyFile)
	require.NoError(t, err)
	require.Contains(t, out, "subject: CN=kubernetes")
	_, err = run("import", "--name", "kubernetes", "--cert", certFile, "--key", keyFile)
	require.ErrorContains(t, err, "already imported")

	// Nstance's own cluster CA in the same storage is refused.
	objs, err := dirstore.Open(dir)
	require.NoError(t, err)
	k, err := secrets.ParseKey([]byte(encKey))
	require.NoError(t, err)
	ring, err := secrets.NewKeyring(k)
	require.NoError(t, err)
	// refuseOwn stores ca at key (as Nstance does) and offers it to import.
	refuseOwn := func(key string, ca *pki.CA) {
		t.Helper()
		_, err := objs.Put(context.Background(), key, ca.CertPEM, objstore.PutOptions{})
		require.NoError(t, err)
		pemKey, err := pki.MarshalPrivateKeyPEM(ca.Key)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(keyFile, pemKey, 0o600))
		require.NoError(t, os.WriteFile(certFile, ca.CertPEM, 0o644))
		_, err = run("import", "--name", "other", "--cert", certFile, "--key", keyFile)
		require.ErrorContains(t, err, "Nstance's own CAs")
	}
	workload, err := pki.GenerateWorkloadCA("c1", time.Hour, now)
	require.NoError(t, err)
	refuseOwn(layout.New("").WorkloadCACert(), workload)
	// A tenant's workload CA likewise.
	_, tpriv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	tenantCA, err := pki.SelfSignTenantWorkloadCA("c1", "acme", tpriv, time.Hour, now)
	require.NoError(t, err)
	refuseOwn(layout.New("").TenantWorkloadCACert("acme"), tenantCA)

	certOut := filepath.Join(files, "dev-node-ca.crt")
	out, err = run("create", "--name", "dev-nodes", "--cert-out", certOut)
	require.NoError(t, err)
	require.Contains(t, out, "subject: CN=dev-nodes")
	first, err := os.ReadFile(certOut)
	require.NoError(t, err)
	_, err = run("create", "--name", "dev-nodes", "--cert-out", certOut)
	require.NoError(t, err)
	again, err := os.ReadFile(certOut)
	require.NoError(t, err)
	require.Equal(t, first, again, "create keeps an existing CA (a dev stack restart)")
	s := &importedca.Store{Objects: objs, Keys: layout.New(""), Secrets: &secrets.Store{Objects: objs, Ring: ring}}
	ca, err := s.Load(context.Background(), "dev-nodes")
	require.NoError(t, err)
	require.Equal(t, first, ca.CertPEM)

	out, err = run("list", "-o", "json")
	require.NoError(t, err)
	var infos []importedca.Info
	require.NoError(t, json.Unmarshal([]byte(out), &infos), out)
	require.Len(t, infos, 2)
	require.Equal(t, "dev-nodes", infos[0].Name)
	require.Equal(t, "kubernetes", infos[1].Name)

	_, err = run("delete", "--name", "kubernetes")
	require.NoError(t, err)
	out, err = run("list")
	require.NoError(t, err)
	require.False(t, strings.Contains(out, "kubernetes"), out)
}
