package clustercmd_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/admin/adminapp"
	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/app"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/s3store"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

const encKey = "thisisatest32bytekey123456789012"

const cfg = `{
  "cluster": {"id": "example-cluster", "leader_election": {"lease_duration": "2s", "renew_interval": "500ms", "retry_interval": "200ms"}},
  "shard": {"id": "dev-1", "infra": {"provider": "tmux", "region": "dev", "zone": "deva"},
    "bind": {"health_addr": "127.0.0.1:0", "election_addr": "127.0.0.1:0", "registration_addr": "127.0.0.1:0", "operator_addr": "127.0.0.1:0", "agent_addr": "127.0.0.1:0"}},
}`

// startCluster runs dev-s3 and one server against it, with the AWS variables
// the admin CLI reads pointing at the dev-s3.
type cluster struct {
	*app.App
	store objstore.Store
}

func startCluster(t *testing.T) *cluster {
	t.Helper()
	return startClusterWith(t, func(*app.Options) {})
}

// startClusterWith is startCluster with the app options adjusted by opts.
func startClusterWith(t *testing.T, opts func(*app.Options)) *cluster {
	t.Helper()
	s3 := devs3test.Start(t, "")
	for k, v := range map[string]string{
		"AWS_ENDPOINT_URL": s3.URL, "AWS_ACCESS_KEY_ID": "dev", "AWS_SECRET_ACCESS_KEY": "dev", "AWS_REGION": "us-east-1",
		"AWS_S3_USE_PATH_STYLE": "true", "AWS_CONFIG_FILE": filepath.Join(t.TempDir(), "none"), "AWS_SHARED_CREDENTIALS_FILE": filepath.Join(t.TempDir(), "none"),
		"NSTANCE_ENCRYPTION_KEY": encKey,
	} {
		t.Setenv(k, v)
	}
	store, err := s3store.NewWithClient(devs3test.Client(s3.URL), devs3test.Bucket, "")
	require.NoError(t, err)
	_, err = store.Put(context.Background(), "config/dev-1.jsonc", []byte(cfg), objstore.PutOptions{})
	require.NoError(t, err)
	o := app.Options{ServerID: "srv", Shard: "dev-1", Store: store, Keys: layout.New(""), Bind: app.BindOverrides{Health: "127.0.0.1:0"}, Log: logr.Discard()}
	opts(&o)
	a, err := app.New(o)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	require.Eventually(t, a.ServingGRPC, 20*time.Second, 20*time.Millisecond)
	return &cluster{App: a, store: store}
}

func runAdmin(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	a := adminapp.New()
	a.Writer, a.ErrWriter = &out, &errOut
	err := adminapp.Run(context.Background(), a, append([]string{"nstance-admin"}, args...))
	return out.String(), err
}

func TestNonceFromAdminRegistersOperator(t *testing.T) {
	a := startCluster(t)
	// The old spellings (--storage-bucket, --output -) still work.
	out, err := runAdmin(t, "cluster", "nonce", "--cluster-id", "example-cluster", "--storage-bucket", "dev", "--key-provider", "env", "--output", "-")
	require.NoError(t, err)
	tok := strings.TrimSpace(out)
	require.Equal(t, 2, strings.Count(tok, "."), "a JWT on stdout, got %q", out)
	require.Equal(t, tok+"\n", out)

	out, err = runAdmin(t, "cluster", "nonce", "--cluster-id", "example-cluster", "--bucket", "dev", "-o", "json", "--expiry", "1h")
	require.NoError(t, err)
	var nj map[string]string
	require.NoError(t, json.Unmarshal([]byte(out), &nj), out)
	require.Equal(t, 2, strings.Count(nj["nonce"], "."))
	require.Equal(t, "example-cluster", nj["cluster_id"])
	require.Equal(t, "nstance-operator", nj["operator_id"])
	exp, err := time.Parse(time.RFC3339, nj["expires_at"])
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(time.Hour), exp, time.Minute)

	outFile := filepath.Join(t.TempDir(), "nonce.jwt")
	out, err = runAdmin(t, "cluster", "nonce", "--cluster-id", "example-cluster", "--bucket", "dev", "--out-file", outFile)
	require.NoError(t, err)
	require.Empty(t, out, "with --out-file nothing goes to stdout")
	b, err := os.ReadFile(outFile)
	require.NoError(t, err)
	require.Equal(t, 2, strings.Count(strings.TrimSpace(string(b)), "."))
	fi, err := os.Stat(outFile)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	// Register with the nonce the way the operator does.
	dir := t.TempDir()
	_, err = runAdmin(t, "cluster", "register-operator", "--cluster-id", "example-cluster", "--bucket", "dev",
		"--registration-addr", "127.0.0.1:1", "--out-dir", dir, "--timeout", "1s", "--nonce-file", filepath.Join(dir, "missing"))
	require.ErrorContains(t, err, "reading nonce")

	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	pubPEM, err := pki.MarshalPublicKeyPEM(pub)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	regConn := dialTLS(t, a.Addrs().Registration, nil, a)
	resp, err := nstancev1.NewRegistrationServiceClient(regConn).RegisterOperator(ctx, &nstancev1.RegisterOperatorRequest{Nonce: tok, PublicKeyPem: string(pubPEM)})
	require.NoError(t, err)
	require.Equal(t, nstancev1.ClientRole_CLIENT_ROLE_OPERATOR, resp.GetIdentity().GetRole())
	require.Equal(t, "spiffe://example-cluster/tenant/default/operator/nstance-operator", resp.GetIdentity().GetUri())

	// The certificate opens the Operator service.
	cert, err := pki.ParseCertificatePEM([]byte(resp.GetCertificatePem()))
	require.NoError(t, err)
	opConn := dialTLS(t, a.Addrs().Operator, &tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: priv}, a)
	st, err := nstancev1.NewOperatorServiceClient(opConn).GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
	require.NoError(t, err)
	require.Equal(t, "dev-1", st.GetShard())
	require.NotEmpty(t, st.GetEtag())

	// The same nonce cannot register another key; with the same key (a retry
	// after a lost reply) it returns the same certificate.
	otherPub, _, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	otherPEM, err := pki.MarshalPublicKeyPEM(otherPub)
	require.NoError(t, err)
	_, err = nstancev1.NewRegistrationServiceClient(regConn).RegisterOperator(ctx, &nstancev1.RegisterOperatorRequest{Nonce: tok, PublicKeyPem: string(otherPEM)})
	require.Equal(t, codes.AlreadyExists, status.Code(err))
	again, err := nstancev1.NewRegistrationServiceClient(regConn).RegisterOperator(ctx, &nstancev1.RegisterOperatorRequest{Nonce: tok, PublicKeyPem: string(pubPEM)})
	require.NoError(t, err)
	require.Equal(t, resp.GetCertificatePem(), again.GetCertificatePem())
}

func TestRegisterOperatorWritesCredentials(t *testing.T) {
	a := startCluster(t)
	dir := t.TempDir()
	t.Setenv("NSTANCE_STORAGE_BUCKET", "dev")
	out, err := runAdmin(t, "cluster", "register-operator", "--cluster-id", "example-cluster",
		"--registration-addr", a.Addrs().Registration, "--tenant", "acme", "--operator-id", "cli", "--out-dir", dir)
	require.NoError(t, err, out)
	require.Contains(t, out, "spiffe://example-cluster/tenant/acme/operator/cli")
	require.Contains(t, out, "nstance-admin context set NAME --servers SHARD=HOST:PORT --ca-cert "+filepath.Join(dir, "ca.crt"))
	firstKey, err := os.ReadFile(filepath.Join(dir, "operator.key"))
	require.NoError(t, err)

	// A registration that fails keeps the key and certificate already there.
	_, err = runAdmin(t, "cluster", "register-operator", "--cluster-id", "example-cluster", "--registration-addr", a.Addrs().Registration,
		"--out-dir", dir, "--nonce-file", filepath.Join(dir, "operator.crt"))
	require.ErrorContains(t, err, "registering with")
	key, err := os.ReadFile(filepath.Join(dir, "operator.key"))
	require.NoError(t, err)
	require.Equal(t, firstKey, key)
	require.NoFileExists(t, filepath.Join(dir, "operator.key.new"), "a refused registration leaves no key behind")

	// JSON output, a second identity in another directory.
	dir2 := t.TempDir()
	out, err = runAdmin(t, "cluster", "register-operator", "--cluster-id", "example-cluster", "--registration-addr", a.Addrs().Registration,
		"--operator-id", "cli2", "--out-dir", dir2, "-o", "json")
	require.NoError(t, err)
	var res map[string]string
	require.NoError(t, json.Unmarshal([]byte(out), &res), out)
	require.Equal(t, "spiffe://example-cluster/tenant/default/operator/cli2", res["identity"])
	require.Equal(t, filepath.Join(dir2, "operator.crt"), res["cert"])
	_, err = time.Parse(time.RFC3339, res["expires_at"])
	require.NoError(t, err)
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "operator.crt"), filepath.Join(dir, "operator.key"))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = nstancev1.NewOperatorServiceClient(dialTLS(t, a.Addrs().Operator, &pair, a)).GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
	require.NoError(t, err)

	// --role admin registers an admin identity, which the Operator port accepts too.
	adminDir := t.TempDir()
	out, err = runAdmin(t, "cluster", "register-operator", "--cluster-id", "example-cluster", "--storage-bucket", "dev",
		"--registration-addr", a.Addrs().Registration, "--tenant", "acme", "--operator-id", "root", "--role", "admin", "--out-dir", adminDir)
	require.NoError(t, err, out)
	require.Contains(t, out, "spiffe://example-cluster/tenant/acme/admin/root")
	pair, err = tls.LoadX509KeyPair(filepath.Join(adminDir, "operator.crt"), filepath.Join(adminDir, "operator.key"))
	require.NoError(t, err)
	_, err = nstancev1.NewOperatorServiceClient(dialTLS(t, a.Addrs().Operator, &pair, a)).GetConfigStatus(ctx, &nstancev1.GetConfigStatusRequest{})
	require.NoError(t, err)
}

func TestNonceErrors(t *testing.T) {
	startCluster(t)
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"wrong encryption key", []string{"--storage-bucket", "dev"}, map[string]string{"NSTANCE_ENCRYPTION_KEY": "another-32-byte-key-abcdefghijkl"}, "does not hold"},
		{"no encryption key", []string{"--storage-bucket", "dev"}, map[string]string{"NSTANCE_ENCRYPTION_KEY": ""}, "NSTANCE_ENCRYPTION_KEY is not set"},
		{"no bucket", nil, nil, "--bucket (or NSTANCE_STORAGE_BUCKET) is required"},
		{"old and new bucket names disagree", []string{"--bucket", "dev", "--storage-bucket", "other"}, nil, `--bucket "dev" and --storage-bucket "other" (its old name) disagree`},
		{"bad output", []string{"--bucket", "dev", "-o", "nonce.jwt"}, nil, `unknown output format "nonce.jwt": want one of table, json, yaml (to write to a file, use --out-file)`},
		{"bad expiry", []string{"--bucket", "dev", "--expiry", "-1h"}, nil, "--expiry must be positive"},
		{"bad provider", []string{"--bucket", "dev", "--key-provider", "kms"}, nil, "unknown provider"},
		{"bad role", []string{"--bucket", "dev", "--role", "agent"}, nil, "--role must be operator or admin"},
		{"empty bucket", []string{"--bucket", "dev", "--prefix", "elsewhere"}, nil, "start the cluster leader first"},
		{"empty bucket, old prefix name", []string{"--bucket", "dev", "--storage-prefix", "elsewhere"}, nil, "start the cluster leader first"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			_, err := runAdmin(t, append([]string{"cluster", "nonce", "--cluster-id", "example-cluster"}, tc.args...)...)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

func dialTLS(t *testing.T, addr string, cert *tls.Certificate, c *cluster) *grpc.ClientConn {
	t.Helper()
	obj, err := c.store.Get(context.Background(), "cluster/ca.crt")
	require.NoError(t, err)
	ca, err := pki.ParseCertificatePEM(obj.Body)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientTLS(pool, cert, "127.0.0.1"))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}
