package manager_test

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/operator/cluster"
	"github.com/nstance-dev/nstance/internal/operator/config"
	"github.com/nstance-dev/nstance/internal/operator/manager"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/grpcserve"
	"github.com/nstance-dev/nstance/internal/server/registration"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

const (
	clusterID = "test-cluster"
	tenant    = "default"
)

// proxy is a TCP forwarder with a fixed address in front of a fake shard,
// whose own address changes when it restarts.
type proxy struct {
	ln      net.Listener
	mu      sync.Mutex
	backend string
	conns   map[net.Conn]struct{}
}

func newProxy(t testing.TB, backend string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &proxy{ln: ln, backend: backend, conns: map[net.Conn]struct{}{}}
	go p.serve()
	t.Cleanup(func() { _ = ln.Close(); p.cut() })
	return p
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) setBackend(addr string) {
	p.mu.Lock()
	p.backend = addr
	p.mu.Unlock()
}

func (p *proxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = map[net.Conn]struct{}{}
}

func (p *proxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		backend := p.backend
		p.mu.Unlock()
		out, err := net.DialTimeout("tcp", backend, time.Second)
		if err != nil {
			_ = in.Close()
			continue
		}
		p.mu.Lock()
		p.conns[in], p.conns[out] = struct{}{}, struct{}{}
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
			_ = src.Close()
		}
		go pipe(in, out)
		go pipe(out, in)
	}
}

// fakeShard is a shardtest shard behind a proxy, restartable with its state.
type fakeShard struct {
	t     testing.TB
	id    string
	ca    *pki.CA
	sh    *shardtest.Shard
	proxy *proxy
}

func startShard(t testing.TB, ca *pki.CA, id, configJSONC string) *fakeShard {
	t.Helper()
	sh := shardtest.Start(t, shardtest.Options{ClusterID: clusterID, ShardID: id, CA: ca, ConfigJSONC: configJSONC, Log: logr.Discard()})
	return &fakeShard{t: t, id: id, ca: ca, sh: sh, proxy: newProxy(t, sh.OperatorAddr)}
}

func (f *fakeShard) stop() {
	f.sh.Stop()
	f.proxy.cut()
}

func (f *fakeShard) restart() {
	old := f.sh
	f.sh = shardtest.Start(f.t, shardtest.Options{ClusterID: clusterID, ShardID: f.id, CA: f.ca, Store: old.Store, Provider: old.Provider, Log: logr.Discard()})
	f.proxy.setBackend(f.sh.OperatorAddr)
}

func (f *fakeShard) client(t testing.TB) nstancev1.OperatorServiceClient {
	return f.sh.Client(t, tenant)
}

// group returns the server's view of a group, or nil.
func (f *fakeShard) group(t testing.TB, id string) *nstancev1.GroupStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := f.client(t).ListGroups(ctx, &nstancev1.ListGroupsRequest{})
	require.NoError(t, err)
	for _, g := range resp.GetGroups() {
		if g.GetSpec().GetGroupId() == id {
			return g
		}
	}
	return nil
}

// fixture is envtest + a cluster CA + a registration server + shards.
type fixture struct {
	t        testing.TB
	ns       string
	ca       *pki.CA
	nonceKey ed25519.PrivateKey
	regAddr  string
	shards   map[string]*fakeShard
}

func newFixture(t testing.TB, shardIDs ...string) *fixture {
	t.Helper()
	return newFixtureConfig(t, nil, shardIDs...)
}

// newFixtureConfig is newFixture whose shards run with the config
// shardConfig returns for their ID (nil: shardtest's default).
func newFixtureConfig(t testing.TB, shardConfig func(id string) string, shardIDs ...string) *fixture {
	t.Helper()
	ca, err := pki.GenerateCA(clusterID, 24*time.Hour, time.Now())
	require.NoError(t, err)
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	f := &fixture{t: t, ca: ca, nonceKey: priv, shards: map[string]*fakeShard{}}
	f.regAddr = startRegistration(t, ca, pub)
	for _, id := range shardIDs {
		cfg := ""
		if shardConfig != nil {
			cfg = shardConfig(id)
		}
		f.shards[id] = startShard(t, ca, id, cfg)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "op-"}}
	require.NoError(t, env.Client.Create(context.Background(), ns))
	f.ns = ns.Name
	require.NoError(t, env.Client.Create(context.Background(), &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: config.DefaultCAConfigMap},
		Data:       map[string]string{"ca.crt": string(ca.CertPEM)},
	}))
	return f
}

func startRegistration(t testing.TB, ca *pki.CA, nonceKey ed25519.PublicKey) string {
	t.Helper()
	cert, err := ca.ServerKeyPair(pki.ServerIdentity{Shard: "s1", ServerID: "nstance-server"}, []string{"127.0.0.1"}, time.Hour, time.Now())
	require.NoError(t, err)
	issuer := &registration.Issuer{CA: ca, ClusterID: clusterID, AgentValidity: time.Hour, OperatorValidity: time.Hour}
	store := memstore.New()
	reg := registration.New(registration.Options{ClusterID: clusterID, ServerID: "reg", Issuer: issuer, NonceKey: nonceKey,
		Store: store, Keys: layout.New(""), Log: logr.Discard()})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := grpcserve.Start(grpcserve.Config{ClusterID: clusterID, ServerCert: cert, ClientCAs: ca.Pool(), Registration: reg},
		grpcserve.Listeners{Registration: ln})
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

func (f *fixture) putNonce(t testing.TB) {
	t.Helper()
	tok, err := nonce.Mint(f.nonceKey, nonce.Claims{Kind: nonce.KindOperator, ClusterID: clusterID, Tenant: tenant,
		RegisteredClaims: jwt.RegisteredClaims{Subject: "operator"}}, time.Hour, time.Now())
	require.NoError(t, err)
	require.NoError(t, env.Client.Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: config.DefaultNonceSecret},
		Data:       map[string][]byte{"nonce.jwt": []byte(tok)},
	}))
}

func (f *fixture) config() *config.Config {
	cfg := &config.Config{ClusterID: clusterID, Tenant: tenant, Shards: map[string]config.Shard{}}
	for id, s := range f.shards {
		cfg.Shards[id] = config.Shard{RegistrationAddr: f.regAddr, OperatorAddr: s.proxy.addr()}
	}
	return cfg
}

func (f *fixture) options(t testing.TB) manager.Options {
	return manager.Options{
		Config: f.config(),
		Env: config.Env{
			Namespace: f.ns, CAConfigMap: config.DefaultCAConfigMap, CertSecret: config.DefaultCertSecret,
			KeySecret: config.DefaultKeySecret, NonceSecret: config.DefaultNonceSecret,
			CAPIServiceAccount: config.DefaultCAPIServiceAccount,
		},
		// Every test has its namespace in one API server: watch only it.
		WatchNamespace:     f.ns,
		RestConfig:         env.Config,
		MetricsRegistry:    prometheus.NewRegistry(),
		Log:                testLogger(),
		MaxBackoff:         300 * time.Millisecond,
		RetryDelay:         300 * time.Millisecond,
		ImportWait:         10 * time.Second,
		SkipNameValidation: true,
		DisableWebhooks:    true,
	}
}

// running is a started operator.
type running struct {
	op     *manager.Operator
	cancel context.CancelFunc
	// done is closed when Start returned; err holds its result.
	done chan struct{}
	err  error
}

// startOperator creates the Cluster objects the cluster templates would
// (the operator creates none) and starts the operator.
func startOperator(t testing.TB, o manager.Options) *running {
	t.Helper()
	ensureClusterObjects(t, o)
	return startOperatorOnly(t, o)
}

// ensureClusterObjects creates the Cluster, NstanceCluster and
// NstanceControlPlane of o's cluster ID in o's namespace when missing, as
// the user (the test's administrator), not as the operator.
func ensureClusterObjects(t testing.TB, o manager.Options) {
	t.Helper()
	ep, err := cluster.Endpoint(cmp.Or(o.Env.CAPIEndpoint, o.RestConfig.Host))
	require.NoError(t, err)
	ns := cmp.Or(o.WatchNamespace, o.Env.Namespace)
	require.NoError(t, cluster.EnsureObjects(context.Background(), env.Client, ns, o.Config.ClusterID, ep))
}

// startOperatorOnly starts the operator and nothing else.
func startOperatorOnly(t testing.TB, o manager.Options) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	op, err := manager.New(ctx, o)
	require.NoError(t, err)
	r := &running{op: op, cancel: cancel, done: make(chan struct{})}
	go func() {
		r.err = op.Start(ctx)
		close(r.done)
	}()
	t.Cleanup(r.stop)
	return r
}

func (r *running) stop() {
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
	}
}

// exited waits for the operator to stop on its own and returns its error.
func (r *running) exited(t testing.TB) error {
	t.Helper()
	select {
	case <-r.done:
		return r.err
	case <-time.After(waitLong):
		t.Fatal("operator kept running")
		return nil
	}
}

func (r *running) waitImported(t testing.TB) {
	t.Helper()
	r.waitImportedWithin(t, 60*time.Second)
}

// waitImportedWithin is waitImported with its own bound.
func (r *running) waitImportedWithin(t testing.TB, d time.Duration) {
	t.Helper()
	select {
	case <-r.op.Imported:
	case <-r.done:
		t.Fatalf("operator stopped before import: %v", r.err)
	case <-time.After(d):
		t.Fatal("import did not finish")
	}
}

func get[T client.Object](t testing.TB, ns, name string, obj T) (T, bool) {
	t.Helper()
	return getIn(t, env.Client, ns, name, obj)
}

// getIn is get in the cluster of c.
func getIn[T client.Object](t testing.TB, c client.Client, ns, name string, obj T) (T, bool) {
	t.Helper()
	err := c.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, obj)
	if err != nil {
		require.True(t, isNotFound(err), "get %s: %v", name, err)
		return obj, false
	}
	return obj, true
}

func isNotFound(err error) bool {
	var se interface{ Status() metav1.Status }
	return errors.As(err, &se) && se.Status().Code == 404
}

func (f *fixture) createPool(t testing.TB, name string, replicas int32, shards ...string) {
	t.Helper()
	f.createPoolDrain(t, name, replicas, 100*time.Millisecond, shards...)
}

// createPoolDrain is createPool whose instances' drains may take drainTimeout.
func (f *fixture) createPoolDrain(t testing.TB, name string, replicas int32, drainTimeout time.Duration, shards ...string) {
	t.Helper()
	createPoolIn(t, f.ns, name, replicas, drainTimeout, shards...)
}

// createPoolIn creates a pool (NstanceMachinePool and MachinePool) in ns.
func createPoolIn(t testing.TB, ns, name string, replicas int32, drainTimeout time.Duration, shards ...string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, &infrav1.NstanceMachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: infrav1.NstanceMachinePoolSpec{
			Group: name, Shards: shards, Template: "worker",
			DrainTimeout: &metav1.Duration{Duration: drainTimeout},
		},
	}))
	require.NoError(t, env.Client.Create(ctx, &clusterv1.MachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: clusterv1.MachinePoolSpec{
			ClusterName: clusterID, Replicas: ptr.To(replicas),
			Template: clusterv1.MachineTemplateSpec{Spec: clusterv1.MachineSpec{
				ClusterName: clusterID, Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr.To("")},
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{
					APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceMachinePool", Name: name,
				},
			}},
		},
	}))
}

func (f *fixture) scale(t testing.TB, name string, replicas int32) {
	t.Helper()
	require.Eventually(t, func() bool {
		var mp clusterv1.MachinePool
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: f.ns, Name: name}, &mp); err != nil {
			return false
		}
		mp.Spec.Replicas = ptr.To(replicas)
		return env.Client.Update(context.Background(), &mp) == nil
	}, 10*time.Second, 50*time.Millisecond)
}

// events returns the notes of Events with reason on the named object.
func (f *fixture) events(t testing.TB, kind, name, reason string) []string {
	t.Helper()
	var list eventsv1.EventList
	require.NoError(t, env.Client.List(context.Background(), &list, client.InNamespace(f.ns)))
	var out []string
	for _, e := range list.Items {
		if e.Regarding.Kind == kind && e.Regarding.Name == name && e.Reason == reason {
			out = append(out, e.Note)
		}
	}
	return out
}

func condition(conds []metav1.Condition, typ string) metav1.ConditionStatus {
	for _, c := range conds {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}

const (
	waitLong = 60 * time.Second
	tick     = 50 * time.Millisecond
)

// testLogger writes operator logs to stderr with -v and discards them
// otherwise. (A t.Log-based logger panics when background goroutines such
// as the event broadcaster log after the test ended.)
func testLogger() logr.Logger {
	if !testing.Verbose() {
		return logr.Discard()
	}
	return zap.New(zap.WriteTo(os.Stderr), zap.UseDevMode(true))
}
