package app

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/pkg/objstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func TestHealthBeforeAndAfterConfig(t *testing.T) {
	store := s3Store(t)
	r := startApp(t, store, "srv-a", "s1")
	require.Eventually(t, func() bool { return r.app.Addrs().Health != "" }, 5*time.Second, 10*time.Millisecond)
	addr := r.app.Addrs().Health
	// No config in storage: the server keeps retrying and reports 503.
	for i := 0; i < 5; i++ {
		require.Equal(t, http.StatusServiceUnavailable, healthCode(t, addr))
		time.Sleep(50 * time.Millisecond)
	}
	putConfig(t, store, "c1", "s1")
	require.Eventually(t, func() bool { return healthCode(t, addr) == http.StatusOK }, 10*time.Second, 20*time.Millisecond)

	resp, err := http.Get("http://" + addr + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Contains(t, string(body), "nstance_server_ready 1")

	// The election port answers over HTTPS with a CA-signed certificate.
	waitServing(t, 10*time.Second, r)
	ca, _ := clusterMaterial(t, store)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: pki.ClientTLS(ca.Pool(), nil, "127.0.0.1")}}
	t.Cleanup(client.CloseIdleConnections)
	eresp, err := client.Get("https://" + r.app.Addrs().Election + "/health")
	require.NoError(t, err)
	ebody, err := io.ReadAll(eresp.Body)
	require.NoError(t, err)
	require.NoError(t, eresp.Body.Close())
	require.Equal(t, http.StatusOK, eresp.StatusCode)
	require.Contains(t, string(ebody), `"shard_leader":true`)
	require.Contains(t, string(ebody), `"cluster_leader":true`)
}

func TestInvalidConfigKeepsServerUnready(t *testing.T) {
	store := s3Store(t)
	_, err := store.Put(context.Background(), "config/s1.jsonc", []byte(`{"cluster": {"id": "c1", "bogus": true}}`), objPut())
	require.NoError(t, err)
	r := startApp(t, store, "srv-a", "s1")
	require.Eventually(t, func() bool { return r.app.Addrs().Health != "" }, 5*time.Second, 10*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, http.StatusServiceUnavailable, healthCode(t, r.app.Addrs().Health))
	// Fixing the config lets it start.
	putConfig(t, store, "c1", "s1")
	require.Eventually(t, func() bool { return healthCode(t, r.app.Addrs().Health) == http.StatusOK }, 10*time.Second, 20*time.Millisecond)
}

func TestNoPlaintextSecretsAfterBootstrap(t *testing.T) {
	store := s3Store(t)
	putConfig(t, store, "c1", "s1")
	r := startApp(t, store, "srv-a", "s1")
	waitServing(t, 10*time.Second, r)
	ctx := context.Background()
	objs, err := store.List(ctx, "")
	require.NoError(t, err)
	var keys []string
	for _, o := range objs {
		keys = append(keys, o.Key)
		obj, err := store.Get(ctx, o.Key)
		require.NoError(t, err)
		for _, needle := range []string{"PRIVATE KEY", testKey, base64.StdEncoding.EncodeToString([]byte(testKey))} {
			require.False(t, bytes.Contains(obj.Body, []byte(needle)), "%s contains %q", o.Key, needle)
		}
	}
	require.Subset(t, keys, []string{"cluster/ca.crt", "cluster/secret/ca.key", "cluster/secret/nonce-signing.key", "cluster/leader.json", "shard/s1/leader.json"})
	caObj, err := store.Get(ctx, "cluster/ca.crt")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(caObj.Body), "-----BEGIN CERTIFICATE-----"))
}

func TestNonceAttacks(t *testing.T) {
	store := s3Store(t)
	putConfig(t, store, "c1", "s1")
	putConfig(t, store, "c1", "s2")
	a := startApp(t, store, "srv-a", "s1")
	b := startApp(t, store, "srv-b", "s2")
	waitServing(t, 15*time.Second, a)
	waitServing(t, 15*time.Second, b)
	ca, nonceKey := clusterMaterial(t, store)
	foreignKey, _ := newKeyPEM(t)
	regA := registrationClient(t, ca, a.app.Addrs().Registration)
	regB := registrationClient(t, ca, b.app.Addrs().Registration)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	now := time.Now()
	op := nonce.Claims{Kind: nonce.KindOperator, ClusterID: "c1", Tenant: "default", RegisteredClaims: jwt.RegisteredClaims{Subject: "op-1"}}
	mint := func(c nonce.Claims, key []byte, ttl time.Duration, at time.Time) string {
		tok, err := nonce.Mint(key, c, ttl, at)
		require.NoError(t, err)
		return tok
	}
	raw := func(m jwt.SigningMethod, key any) string {
		c := op
		c.ID, c.IssuedAt, c.NotBefore, c.ExpiresAt = "raw-jti", jwt.NewNumericDate(now), jwt.NewNumericDate(now), jwt.NewNumericDate(now.Add(time.Hour))
		tok, err := jwt.NewWithClaims(m, c).SignedString(key)
		require.NoError(t, err)
		return tok
	}
	register := func(client nstancev1.RegistrationServiceClient, tok string) error {
		_, pubPEM := newKeyPEM(t)
		_, err := client.RegisterOperator(ctx, &nstancev1.RegisterOperatorRequest{Nonce: tok, PublicKeyPem: pubPEM})
		return err
	}
	wrongCluster := op
	wrongCluster.ClusterID = "c2"
	later := op
	later.NotBefore = jwt.NewNumericDate(now.Add(time.Hour))
	agentNonce := nonce.Claims{Kind: nonce.KindAgent, ClusterID: "c1", Tenant: "default", Shard: "s1", RegisteredClaims: jwt.RegisteredClaims{Subject: "i-1"}}

	// A nonce used once, for the replay cases.
	used := mint(op, nonceKey, time.Hour, now)
	require.NoError(t, register(regA, used))

	cases := []struct {
		name   string
		client nstancev1.RegistrationServiceClient
		token  string
		prep   func()
		code   string
		reason string
	}{
		// Registration callers are anonymous: every refusal is generic (the
		// reason is in the server log), naming no cluster, shard or tenant.
		{"expired", regA, mint(op, nonceKey, time.Minute, now.Add(-time.Hour)), nil, "Unauthenticated", "the nonce has expired"},
		// Not valid yet is worth retrying (clock skew): a code of its own.
		{"not yet valid", regA, mint(later, nonceKey, 2*time.Hour, now), nil, "FailedPrecondition", "the nonce is not valid yet"},
		{"wrong cluster", regA, mint(wrongCluster, nonceKey, time.Hour, now), nil, "Unauthenticated", "the nonce is not valid here"},
		{"wrong kind", regA, mint(agentNonce, nonceKey, time.Hour, now), nil, "Unauthenticated", "the nonce is not valid here"},
		{"alg none", regA, raw(jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType), nil, "Unauthenticated", "the nonce is not valid here"},
		{"HS256 keyed with the public key", regA, raw(jwt.SigningMethodHS256, []byte(nonceKey.Public().(ed25519.PublicKey))), nil, "Unauthenticated", "the nonce is not valid here"},
		{"foreign Ed25519 key", regA, mint(op, foreignKey, time.Hour, now), nil, "Unauthenticated", "the nonce is not valid here"},
		{"lifetime over the maximum", regA, mint(op, nonceKey, 25*time.Hour, now), nil, "Unauthenticated", "the nonce is not valid here"},
		{"replay", regA, used, nil, "AlreadyExists", "already been used"},
		{"replay on a second server after the first server's cache is wiped", regB, used, func() {
			require.NoError(t, a.app.Cache().Wipe(ctx))
		}, "AlreadyExists", "already been used"},
	}
	require.Len(t, cases, 10)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.prep != nil {
				tc.prep()
			}
			err := register(tc.client, tc.token)
			require.Error(t, err)
			require.Contains(t, err.Error(), "code = "+tc.code)
			require.Contains(t, err.Error(), tc.reason)
			for _, id := range []string{"c1", "c2", "s1", "s2", "default"} {
				require.NotContains(t, status.Convert(err).Message(), id)
			}
		})
	}
	// The refused nonces did not disturb valid ones.
	require.NoError(t, register(regB, mint(op, nonceKey, time.Hour, now)))
}

func objPut() objstore.PutOptions { return objstore.PutOptions{} }

// ignoresConditions drops If-None-Match and If-Match from every write.
type ignoresConditions struct{ objstore.Store }

func (s ignoresConditions) Put(ctx context.Context, key string, body []byte, _ objstore.PutOptions) (string, error) {
	return s.Store.Put(ctx, key, body, objstore.PutOptions{})
}

// A store that ignores conditional writes would make elections and nonces
// silently unsafe: the server refuses to run on it, before campaigning.
func TestRefusesStoreWithoutConditionalWrites(t *testing.T) {
	inner := s3Store(t)
	putConfig(t, inner, "c1", "s1")
	r := startApp(t, ignoresConditions{inner}, "srv-a", "s1")
	var err error
	select {
	case err = <-r.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the server kept running on a store without conditional writes")
	}
	require.ErrorContains(t, err, "does not honour conditional writes")
	_, gerr := inner.Head(context.Background(), "shard/s1/leader.json")
	require.ErrorIs(t, gerr, objstore.ErrNotFound, "no lease was written")
	r.once.Do(func() {}) // Run has returned; stop must not wait again
}

// The server renews its own certificate before it expires and presents the
// new one on every listener without restarting: with a 3-second validity,
// handshakes keep succeeding long after the first certificate expired.
func TestServerCertificateRenewedLive(t *testing.T) {
	store := s3Store(t)
	cfg := strings.Replace(string(testConfig("c1", "s1")), `"shard": {`, `"certificates": {"server_validity": "3s"},
  "shard": {`, 1)
	_, err := store.Put(context.Background(), "config/s1.jsonc", []byte(cfg), objstore.PutOptions{})
	require.NoError(t, err)
	r := startApp(t, store, "srv-a", "s1")
	waitServing(t, 15*time.Second, r)
	ca, _ := clusterMaterial(t, store)
	peer := func(addr string) *x509.Certificate {
		c, err := tls.Dial("tcp", addr, pki.ClientTLS(ca.Pool(), nil, "127.0.0.1"))
		require.NoError(t, err, "handshake with %s", addr)
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0]
	}
	first := peer(r.app.Addrs().Registration)
	serials := map[string]bool{}
	for time.Now().Before(first.NotAfter.Add(2 * time.Second)) {
		for _, addr := range []string{r.app.Addrs().Registration, r.app.Addrs().Election} {
			c := peer(addr)
			require.True(t, time.Now().Before(c.NotAfter), "an expired certificate was presented")
			serials[c.SerialNumber.String()] = true
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.GreaterOrEqual(t, len(serials), 2, "the certificate was replaced")
}
