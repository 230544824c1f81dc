package bootstrap_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/operator/bootstrap"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/grpcserve"
	"github.com/nstance-dev/nstance/internal/server/operatorsvc"
	"github.com/nstance-dev/nstance/internal/server/registration"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

const clusterID = "c1"

// cluster is a CA, a nonce key and one shared nonce ledger, with real
// registration servers started per shard on 127.0.0.1.
type cluster struct {
	ca       *pki.CA
	nonceKey ed25519.PrivateKey
	// store holds the nonce ledger and operator records every shard shares.
	store objstore.Store
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	ca, err := pki.GenerateCA(clusterID, 24*time.Hour, time.Now())
	require.NoError(t, err)
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	return &cluster{
		ca: ca, nonceKey: priv, store: memstore.New(),
	}
}

// startShard serves the registration API and returns its address.
func (c *cluster) startShard(t *testing.T, shard string) string {
	t.Helper()
	srvCert, err := c.ca.ServerKeyPair(pki.ServerIdentity{Shard: "s1", ServerID: "nstance-server"}, []string{"127.0.0.1"}, time.Hour, time.Now())
	require.NoError(t, err)
	issuer := &registration.Issuer{CA: c.ca, ClusterID: clusterID, AgentValidity: time.Hour, OperatorValidity: time.Hour}
	reg := registration.New(registration.Options{ClusterID: clusterID, ServerID: "srv-" + shard, Issuer: issuer,
		NonceKey: c.nonceKey.Public().(ed25519.PublicKey), Store: c.store, Keys: layout.New(""), Log: logr.Discard()})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := grpcserve.Start(grpcserve.Config{
		ClusterID: clusterID, ServerCert: srvCert, ClientCAs: c.ca.Pool(),
		Registration: reg, Operator: operatorsvc.New(operatorsvc.Options{Shard: shard, Issuer: issuer}),
	}, grpcserve.Listeners{Registration: ln})
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

func (c *cluster) nonce(t *testing.T) string {
	t.Helper()
	tok, err := nonce.Mint(c.nonceKey, nonce.Claims{Kind: nonce.KindOperator, ClusterID: clusterID, Tenant: "default",
		RegisteredClaims: jwtSubject("operator-1")}, time.Hour, time.Now())
	require.NoError(t, err)
	return tok
}

// deadAddr is a 127.0.0.1 address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "boot-"}}
	require.NoError(t, env.Client.Create(context.Background(), ns))
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), ns) })
	return ns.Name
}

func put(t *testing.T, obj client.Object) {
	t.Helper()
	require.NoError(t, env.Client.Create(t.Context(), obj))
}

func (c *cluster) seed(t *testing.T, ns string, withNonce bool) {
	t.Helper()
	put(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nstance-cluster-ca"},
		Data: map[string]string{bootstrap.CAKey: string(c.ca.CertPEM)}})
	if withNonce {
		put(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nstance-operator-nonce"},
			Data: map[string][]byte{bootstrap.NonceKey: []byte(c.nonce(t))}})
	}
}

func options(ns string, shards ...bootstrap.Shard) bootstrap.Options {
	return bootstrap.Options{
		Namespace: ns, CAConfigMap: "nstance-cluster-ca", KeySecret: "nstance-operator-key",
		NonceSecret: "nstance-operator-nonce", CertSecret: "nstance-operator-cert",
		ClusterID: clusterID, Shards: shards,
		Registrar: bootstrap.GRPCRegistrar{Timeout: 5 * time.Second, Hostname: "operator-test"},
		Backoff:   wait.Backoff{Duration: 20 * time.Millisecond, Factor: 2, Steps: 3},
		Log:       logr.Discard(),
	}
}

func getSecret(t *testing.T, ns, name string) *corev1.Secret {
	t.Helper()
	var s corev1.Secret
	require.NoError(t, env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &s))
	return &s
}

func secretExists(t *testing.T, ns, name string) bool {
	t.Helper()
	var s corev1.Secret
	err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: ns, Name: name}, &s)
	if apierrors.IsNotFound(err) {
		return false
	}
	require.NoError(t, err)
	return true
}

func certPublicKey(t *testing.T, certPEM []byte) ed25519.PublicKey {
	t.Helper()
	cert, err := pki.ParseCertificatePEM(certPEM)
	require.NoError(t, err)
	pub, ok := cert.PublicKey.(ed25519.PublicKey)
	require.True(t, ok)
	return pub
}

func TestFreshStartThenRestartReuses(t *testing.T) {
	cl := newCluster(t)
	ns := newNamespace(t)
	cl.seed(t, ns, true)
	addrA, addrB := cl.startShard(t, "a"), cl.startShard(t, "b")
	opts := options(ns, bootstrap.Shard{ID: "a", Addr: addrA}, bootstrap.Shard{ID: "b", Addr: addrB})

	creds, err := bootstrap.Ensure(t.Context(), env.Client, opts)
	require.NoError(t, err)
	require.True(t, creds.Registered)
	require.Equal(t, pki.RoleOperator, creds.Identity.Role)

	key := getSecret(t, ns, "nstance-operator-key")
	cert := getSecret(t, ns, "nstance-operator-cert")
	require.Equal(t, corev1.SecretTypeTLS, cert.Type)
	require.Equal(t, creds.CertPEM, cert.Data[bootstrap.CertKey])
	storedPub, err := pki.ParseEd25519PublicKeyPEM(key.Data[bootstrap.PublicKeyKey])
	require.NoError(t, err)
	require.True(t, storedPub.Equal(certPublicKey(t, cert.Data[bootstrap.CertKey])), "certificate is for the stored key")
	require.Equal(t, key.Data[bootstrap.PrivateKeyKey], cert.Data[bootstrap.CertKeyKey])
	// The keypair Secret was written before the certificate Secret.
	require.LessOrEqual(t, key.CreationTimestamp.Unix(), cert.CreationTimestamp.Unix())
	require.Less(t, mustInt(t, key.ResourceVersion), mustInt(t, cert.ResourceVersion))

	// Restart without a nonce: the stored certificate is reused.
	require.NoError(t, env.Client.Delete(t.Context(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nstance-operator-nonce"}}))
	again, err := bootstrap.Ensure(t.Context(), env.Client, opts)
	require.NoError(t, err)
	require.False(t, again.Registered)
	require.Equal(t, creds.CertPEM, again.CertPEM)
	require.Equal(t, creds.KeyPEM, again.KeyPEM)
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	var n int64
	for _, r := range s {
		require.True(t, r >= '0' && r <= '9', "resourceVersion %q", s)
		n = n*10 + int64(r-'0')
	}
	return n
}

func TestCrashAfterKeypairResumesWithSameKey(t *testing.T) {
	cl := newCluster(t)
	ns := newNamespace(t)
	cl.seed(t, ns, true)
	opts := options(ns, bootstrap.Shard{ID: "a", Addr: cl.startShard(t, "a")})

	crash := errors.New("injected crash")
	crashing := opts
	crashing.AfterKeypairStored = func() error { return crash }
	_, err := bootstrap.Ensure(t.Context(), env.Client, crashing)
	require.ErrorIs(t, err, crash)
	require.True(t, secretExists(t, ns, "nstance-operator-key"))
	require.False(t, secretExists(t, ns, "nstance-operator-cert"))
	keyBefore := getSecret(t, ns, "nstance-operator-key")

	creds, err := bootstrap.Ensure(t.Context(), env.Client, opts)
	require.NoError(t, err)
	require.True(t, creds.Registered)
	keyAfter := getSecret(t, ns, "nstance-operator-key")
	require.Equal(t, keyBefore.Data, keyAfter.Data, "keypair Secret untouched")
	storedPub, err := pki.ParseEd25519PublicKeyPEM(keyAfter.Data[bootstrap.PublicKeyKey])
	require.NoError(t, err)
	require.True(t, storedPub.Equal(certPublicKey(t, creds.CertPEM)))
}

func TestRegistrationFallsBackToNextShard(t *testing.T) {
	cl := newCluster(t)
	ns := newNamespace(t)
	cl.seed(t, ns, true)
	opts := options(ns, bootstrap.Shard{ID: "a", Addr: deadAddr(t)}, bootstrap.Shard{ID: "b", Addr: cl.startShard(t, "b")})
	creds, err := bootstrap.Ensure(t.Context(), env.Client, opts)
	require.NoError(t, err)
	require.True(t, creds.Registered)
	// The certificate verifies against the CA: good for every shard.
	_, err = creds.Leaf.Verify(x509.VerifyOptions{Roots: cl.ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	require.NoError(t, err)
}

func TestFatalErrors(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, cl *cluster, ns string) bootstrap.Options
		is      error
		want    string
	}{
		{
			name: "no CA ConfigMap",
			prepare: func(t *testing.T, cl *cluster, ns string) bootstrap.Options {
				return options(ns, bootstrap.Shard{ID: "a", Addr: cl.startShard(t, "a")})
			},
			want: "cluster CA ConfigMap",
		},
		{
			name: "CA ConfigMap without PEM",
			prepare: func(t *testing.T, cl *cluster, ns string) bootstrap.Options {
				put(t, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nstance-cluster-ca"}, Data: map[string]string{"ca.crt": "garbage"}})
				return options(ns, bootstrap.Shard{ID: "a", Addr: cl.startShard(t, "a")})
			},
			want: "holds no PEM certificate",
		},
		{
			name: "nonce Secret missing",
			prepare: func(t *testing.T, cl *cluster, ns string) bootstrap.Options {
				cl.seed(t, ns, false)
				return options(ns, bootstrap.Shard{ID: "a", Addr: cl.startShard(t, "a")})
			},
			is: bootstrap.ErrNonceMissing, want: "nstance-operator-nonce",
		},
		{
			name: "nonce Secret without key",
			prepare: func(t *testing.T, cl *cluster, ns string) bootstrap.Options {
				cl.seed(t, ns, false)
				put(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nstance-operator-nonce"}, Data: map[string][]byte{"other": []byte("x")}})
				return options(ns, bootstrap.Shard{ID: "a", Addr: cl.startShard(t, "a")})
			},
			is: bootstrap.ErrNonceMissing, want: "nonce.jwt",
		},
		{
			name: "all shards unreachable",
			prepare: func(t *testing.T, cl *cluster, ns string) bootstrap.Options {
				cl.seed(t, ns, true)
				return options(ns, bootstrap.Shard{ID: "a", Addr: deadAddr(t)}, bootstrap.Shard{ID: "b", Addr: deadAddr(t)})
			},
			is: bootstrap.ErrRegistrationFailed, want: "after 3 rounds: a (127.0.0.1",
		},
		{
			name: "nonce from another cluster rejected",
			prepare: func(t *testing.T, cl *cluster, ns string) bootstrap.Options {
				other := newCluster(t)
				cl.seed(t, ns, false)
				put(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nstance-operator-nonce"},
					Data: map[string][]byte{bootstrap.NonceKey: []byte(other.nonce(t))}})
				return options(ns, bootstrap.Shard{ID: "a", Addr: cl.startShard(t, "a")})
			},
			is: bootstrap.ErrRegistrationFailed, want: "the nonce is not valid here", // generic: the server logs the reason
		},
		{
			name: "corrupt keypair Secret",
			prepare: func(t *testing.T, cl *cluster, ns string) bootstrap.Options {
				cl.seed(t, ns, true)
				put(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nstance-operator-key"},
					Data: map[string][]byte{bootstrap.PrivateKeyKey: []byte("not pem")}})
				return options(ns, bootstrap.Shard{ID: "a", Addr: cl.startShard(t, "a")})
			},
			want: "delete the Secret",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl := newCluster(t)
			ns := newNamespace(t)
			_, err := bootstrap.Ensure(t.Context(), env.Client, tt.prepare(t, cl, ns))
			require.Error(t, err)
			if tt.is != nil {
				require.ErrorIs(t, err, tt.is)
			}
			require.ErrorContains(t, err, tt.want)
			require.False(t, secretExists(t, ns, "nstance-operator-cert"))
		})
	}
}

func TestReplayedNonceFailsButStoredCertSurvives(t *testing.T) {
	cl := newCluster(t)
	addr := cl.startShard(t, "a")
	tok := cl.nonce(t)
	for i, wantErr := range []bool{false, true} {
		ns := newNamespace(t)
		cl.seed(t, ns, false)
		put(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "nstance-operator-nonce"},
			Data: map[string][]byte{bootstrap.NonceKey: []byte(tok)}})
		_, err := bootstrap.Ensure(t.Context(), env.Client, options(ns, bootstrap.Shard{ID: "a", Addr: addr}))
		if wantErr {
			require.ErrorIs(t, err, bootstrap.ErrRegistrationFailed, "attempt %d", i)
			require.ErrorContains(t, err, "already been used")
		} else {
			require.NoError(t, err)
		}
	}
}

// lossyRegistrar registers for real but loses the first reply(ies), or
// answers with a scripted error, as a flaky network or a skewed clock would.
type lossyRegistrar struct {
	real  bootstrap.Registrar
	lose  int
	err   error
	calls int
	first []byte
}

func (r *lossyRegistrar) Register(ctx context.Context, addr string, roots *x509.CertPool, nonce string, pub []byte) ([]byte, error) {
	r.calls++
	if r.err != nil {
		return nil, r.err
	}
	cert, err := r.real.Register(ctx, addr, roots, nonce, pub)
	if err == nil && r.calls <= r.lose {
		if r.first == nil {
			r.first = cert
		}
		return nil, status.Error(codes.Unavailable, "connection reset (reply lost)")
	}
	return cert, err
}

// TestLostReplyIsRetried: the server issued the certificate but the reply
// never arrived; the next round, with the same key, gets the same
// certificate.
func TestLostReplyIsRetried(t *testing.T) {
	cl := newCluster(t)
	ns := newNamespace(t)
	cl.seed(t, ns, true)
	opts := options(ns, bootstrap.Shard{ID: "a", Addr: cl.startShard(t, "a")})
	lossy := &lossyRegistrar{real: opts.Registrar, lose: 2}
	opts.Registrar = lossy
	creds, err := bootstrap.Ensure(t.Context(), env.Client, opts)
	require.NoError(t, err)
	require.Equal(t, 3, lossy.calls)
	require.Equal(t, lossy.first, creds.CertPEM, "the retry got the certificate issued first")
}

// TestNotYetValidIsRetriedWithinTheSkewAllowance: a nonce the servers find
// not valid yet is retried (beyond the backoff's rounds) until the
// allowance is used up, then the error says what to fix.
func TestNotYetValidIsRetriedWithinTheSkewAllowance(t *testing.T) {
	cl := newCluster(t)
	ns := newNamespace(t)
	cl.seed(t, ns, true)
	opts := options(ns, bootstrap.Shard{ID: "a", Addr: cl.startShard(t, "a")})
	early := &lossyRegistrar{err: status.Error(codes.FailedPrecondition, "registration refused for now: the nonce is not valid yet")}
	opts.Registrar = early
	opts.SkewAllowance = 300 * time.Millisecond
	_, err := bootstrap.Ensure(t.Context(), env.Client, opts)
	require.ErrorIs(t, err, bootstrap.ErrRegistrationFailed)
	require.ErrorContains(t, err, "still not valid yet")
	require.Greater(t, early.calls, 3, "retried beyond the transient rounds")
	require.False(t, secretExists(t, ns, "nstance-operator-cert"))
}
