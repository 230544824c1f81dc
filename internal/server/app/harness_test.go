package app

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/internal/storage"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/s3store"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

const testKey = "thisisatest32bytekey123456789012"

// testConfig is a shard config with every port on 127.0.0.1:0 and short leases.
func testConfig(cluster, shard string) []byte {
	return []byte(fmt.Sprintf(`{
  "cluster": {
    "id": %q,
    "leader_election": {"lease_duration": "2s", "renew_interval": "500ms", "retry_interval": "200ms"},
  },
  "shard": {
    "id": %q,
    "infra": {"provider": "mock", "region": "dev", "zone": "deva"},
    "bind": {
      "health_addr": "127.0.0.1:0", "election_addr": "127.0.0.1:0", "registration_addr": "127.0.0.1:0",
      "operator_addr": "127.0.0.1:0", "agent_addr": "127.0.0.1:0",
    },
  },
}`, cluster, shard))
}

// s3Store starts a dev-s3 and returns a store talking to it over HTTP.
func s3Store(t *testing.T) objstore.Store {
	t.Helper()
	srv := devs3test.Start(t, "")
	s, err := s3store.NewWithClient(devs3test.Client(srv.URL), devs3test.Bucket, "")
	require.NoError(t, err)
	return s
}

type running struct {
	app    *App
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// stop cancels the app and waits for Run to return (idempotent).
func (r *running) stop() error {
	r.once.Do(func() {
		r.cancel()
		r.err = <-r.done
	})
	return r.err
}

func startApp(t *testing.T, store objstore.Store, id, shard string) *running {
	t.Helper()
	a, err := New(Options{
		ServerID: id, Shard: shard, Store: store, Keys: layout.New(""), CacheDir: t.TempDir(),
		Bind:           BindOverrides{Health: "127.0.0.1:0"},
		Getenv:         func(k string) string { return map[string]string{"NSTANCE_ENCRYPTION_KEY": testKey}[k] },
		Log:            testr.NewWithOptions(t, testr.Options{Verbosity: 0}).WithValues("server", id),
		StorageBackoff: storage.Backoff{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{app: a, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- a.Run(ctx) }()
	t.Cleanup(func() { _ = r.stop() })
	return r
}

func putConfig(t *testing.T, store objstore.Store, cluster, shard string) {
	t.Helper()
	_, err := store.Put(context.Background(), layout.New("").Config(shard), testConfig(cluster, shard), objstore.PutOptions{})
	require.NoError(t, err)
}

func healthCode(t *testing.T, addr string) int {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/health")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// waitServing waits until one of apps serves gRPC and returns it.
func waitServing(t *testing.T, timeout time.Duration, apps ...*running) *running {
	t.Helper()
	var got *running
	require.Eventually(t, func() bool {
		for _, r := range apps {
			if r.app.ServingGRPC() {
				got = r
				return true
			}
		}
		return false
	}, timeout, 20*time.Millisecond)
	return got
}

// clusterMaterial reads the CA and nonce key the way an admin would.
func clusterMaterial(t *testing.T, store objstore.Store) (*pki.CA, ed25519.PrivateKey) {
	t.Helper()
	ctx := context.Background()
	k, err := secrets.ParseKey([]byte(testKey))
	require.NoError(t, err)
	ring, err := secrets.NewKeyring(k)
	require.NoError(t, err)
	ss := &secrets.Store{Objects: store, Ring: ring}
	keys := layout.New("")
	caKey, err := ss.Get(ctx, keys.CAKey())
	require.NoError(t, err)
	caCert, err := store.Get(ctx, keys.CACert())
	require.NoError(t, err)
	ca, err := pki.LoadCA(caCert.Body, caKey)
	require.NoError(t, err)
	nk, err := ss.Get(ctx, keys.NonceSigningKey())
	require.NoError(t, err)
	signer, err := pki.ParsePrivateKeyPEM(nk)
	require.NoError(t, err)
	return ca, signer.(ed25519.PrivateKey)
}

func registrationClient(t *testing.T, ca *pki.CA, addr string) nstancev1.RegistrationServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientTLS(ca.Pool(), nil, "127.0.0.1"))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return nstancev1.NewRegistrationServiceClient(conn)
}

func operatorClient(t *testing.T, ca *pki.CA, addr string, cert *tls.Certificate) nstancev1.OperatorServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientTLS(ca.Pool(), cert, "127.0.0.1"))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return nstancev1.NewOperatorServiceClient(conn)
}

func newKeyPEM(t *testing.T) (ed25519.PrivateKey, string) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	p, err := pki.MarshalPublicKeyPEM(pub)
	require.NoError(t, err)
	return priv, string(p)
}
