package capicontract_test

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	capicluster "sigs.k8s.io/cluster-api/core/reconcilers/cluster"
	capimachine "sigs.k8s.io/cluster-api/core/reconcilers/machine"
	capimachinepool "sigs.k8s.io/cluster-api/core/reconcilers/machinepool"
	"sigs.k8s.io/cluster-api/core/setup"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/index"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	cpv1 "github.com/nstance-dev/nstance/api/controlplane/v1beta1"
	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/operator/cluster"
	opconfig "github.com/nstance-dev/nstance/internal/operator/config"
	"github.com/nstance-dev/nstance/internal/operator/drain"
	"github.com/nstance-dev/nstance/internal/operator/manager"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/grpcserve"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/registration"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

const (
	clusterID = "contract"
	tenant    = "default"
	shardID   = "shard-a"
	waitLong  = 60 * time.Second
	// drainWait covers core CAPI's drain cadence: a drain pass that leaves
	// pods behind (a PDB refusal, or pods still terminating) is retried
	// after a fixed 20s, and a blocked drain takes two such retries to end.
	drainWait = 2 * time.Minute
	tick      = 50 * time.Millisecond
)

// nodeProvider is the mock provider that also registers a Node for every
// instance it creates, with the instance's provider ID and a kubelet's
// healthy conditions, as the dev stack's providers write fake Nodes when an
// instance starts.
type nodeProvider struct {
	*mock.Provider
	c client.Client
}

func (p *nodeProvider) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	inst, err := p.Provider.Create(ctx, req)
	if err != nil {
		return inst, err
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: inst.InstanceID}, Spec: corev1.NodeSpec{ProviderID: inst.ProviderID}}
	if err := p.c.Create(ctx, node); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return inst, nil
		}
		return inst, fmt.Errorf("create Node %s: %w", node.Name, err)
	}
	// The conditions a kubelet reports; core CAPI's NodeHealthy needs them all.
	now := metav1.Now()
	node.Status.Conditions = []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now},
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", LastHeartbeatTime: now, LastTransitionTime: now},
		{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", LastHeartbeatTime: now, LastTransitionTime: now},
		{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientPID", LastHeartbeatTime: now, LastTransitionTime: now},
	}
	if err := p.c.Status().Update(ctx, node); err != nil {
		return inst, fmt.Errorf("mark Node %s ready: %w", node.Name, err)
	}
	return inst, nil
}

// fixture is a namespace, a registration server and one fake shard.
type fixture struct {
	ns       string
	shard    *shardtest.Shard
	provider *nodeProvider
	opts     manager.Options
	// ca is the cluster CA, for further shards (addShard).
	ca *pki.CA
}

func newFixture(t *testing.T) *fixture { return newFixtureNodesIn(t, env.Client) }

// bootstrapSecret is the bootstrap data Secret of every fixture namespace.
// Named after the Cluster, so clusterctl move takes it along (soft
// ownership), as it takes a bootstrap provider's Secret through its owner.
const bootstrapSecret = clusterID + "-bootstrap"

// newFixtureNodesIn is newFixture with the fake Nodes registered in the
// cluster of nodes (the workload cluster of the management-mode test).
func newFixtureNodesIn(t *testing.T, nodes client.Client) *fixture {
	t.Helper()
	return newFixtureWith(t, nodes, nil)
}

// newFixtureWith is newFixtureNodesIn whose shard options tune adjusts
// (nil: none); a provider it sets replaces the Node-registering mock.
func newFixtureWith(t *testing.T, nodes client.Client, tune func(*shardtest.Options)) *fixture {
	t.Helper()
	ctx := context.Background()
	ca, err := pki.GenerateCA(clusterID, 24*time.Hour, time.Now())
	require.NoError(t, err)
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	regAddr := startRegistration(t, ca, pub)
	prov := &nodeProvider{Provider: mock.New(), c: nodes}
	so := shardtest.Options{ClusterID: clusterID, ShardID: shardID, CA: ca, Provider: prov, Log: logr.Discard()}
	if tune != nil {
		tune(&so)
		if so.Provider != provider.Provider(prov) {
			prov = nil
		}
	}
	sh := shardtest.Start(t, so)

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "capi-"}}
	require.NoError(t, env.Client.Create(ctx, ns))
	require.NoError(t, env.Client.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: opconfig.DefaultCAConfigMap},
		Data:       map[string]string{"ca.crt": string(ca.CertPEM)},
	}))
	tok, err := nonce.Mint(priv, nonce.Claims{Kind: nonce.KindOperator, ClusterID: clusterID, Tenant: tenant,
		RegisteredClaims: jwt.RegisteredClaims{Subject: "operator"}}, time.Hour, time.Now())
	require.NoError(t, err)
	require.NoError(t, env.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: opconfig.DefaultNonceSecret},
		Data:       map[string][]byte{"nonce.jwt": []byte(tok)},
	}))
	// The bootstrap data Secret the Machines and MachinePools name (no
	// bootstrap provider runs here): its value is what instances get.
	require.NoError(t, env.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: bootstrapSecret},
		Type:       clusterv1.ClusterSecretType,
		Data:       map[string][]byte{"value": []byte("#cloud-config\n"), "format": []byte("cloud-config")},
	}))
	return &fixture{ns: ns.Name, shard: sh, provider: prov, ca: ca, opts: manager.Options{
		Config: &opconfig.Config{ClusterID: clusterID, Tenant: tenant, Shards: map[string]opconfig.Shard{
			shardID: {RegistrationAddr: regAddr, OperatorAddr: sh.OperatorAddr}}},
		Env: opconfig.Env{
			Namespace: ns.Name, CAConfigMap: opconfig.DefaultCAConfigMap, CertSecret: opconfig.DefaultCertSecret,
			KeySecret: opconfig.DefaultKeySecret, NonceSecret: opconfig.DefaultNonceSecret,
			CAPIServiceAccount: opconfig.DefaultCAPIServiceAccount,
		},
		// Every test has its namespace in one API server: watch only it.
		WatchNamespace: ns.Name,
		RestConfig:     env.Config, MetricsRegistry: prometheus.NewRegistry(), Log: logr.Discard(),
		MaxBackoff: 300 * time.Millisecond, RetryDelay: 300 * time.Millisecond, ImportWait: 5 * time.Second,
		SkipNameValidation: true, DisableWebhooks: true,
		DrainRetryInterval: 100 * time.Millisecond, MachinePollInterval: 100 * time.Millisecond,
	}}
}

func startRegistration(t *testing.T, ca *pki.CA, nonceKey ed25519.PublicKey) string {
	t.Helper()
	cert, err := ca.ServerKeyPair(pki.ServerIdentity{Shard: "s1", ServerID: "nstance-server"}, []string{"127.0.0.1"}, time.Hour, time.Now())
	require.NoError(t, err)
	store := memstore.New()
	reg := registration.New(registration.Options{ClusterID: clusterID, ServerID: "reg", NonceKey: nonceKey,
		Issuer: &registration.Issuer{CA: ca, ClusterID: clusterID, AgentValidity: time.Hour, OperatorValidity: time.Hour},
		Store:  store, Keys: layout.New(""), Log: logr.Discard()})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := grpcserve.Start(grpcserve.Config{ClusterID: clusterID, ServerCert: cert, ClientCAs: ca.Pool(), Registration: reg},
		grpcserve.Listeners{Registration: ln})
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// bindCAPIWorkloadRole grants the ServiceAccount whose token goes into the
// kubeconfig Secret exactly the rules of the chart's capi-workload
// ClusterRole, so core Cluster API reaches the workload cluster with what
// the chart grants and nothing more.
func bindCAPIWorkloadRole(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	root, err := kubetest.RepoRoot()
	require.NoError(t, err)
	data, err := os.ReadFile(filepath.Join(root, "deploy", "helm", "nstance-operator", "templates", "capi-workload.yaml"))
	require.NoError(t, err)
	var role *rbacv1.ClusterRole
	for doc := range strings.SplitSeq(string(data), "\n---\n") {
		if !strings.Contains(doc, "\nkind: ClusterRole\n") {
			continue
		}
		// Template lines (names, labels, conditionals) are not YAML; the
		// rules carry none.
		var kept []string
		for line := range strings.SplitSeq(doc, "\n") {
			if !strings.Contains(line, "{{") {
				kept = append(kept, line)
			}
		}
		role = &rbacv1.ClusterRole{}
		require.NoError(t, yaml.Unmarshal([]byte(strings.Join(kept, "\n")), role))
	}
	require.NotNil(t, role, "capi-workload ClusterRole in the chart")
	require.NotEmpty(t, role.Rules)
	role.ObjectMeta = metav1.ObjectMeta{Name: "capi-workload-" + ns}
	require.NoError(t, env.Client.Create(ctx, role))
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: opconfig.DefaultCAPIServiceAccount}},
	}
	require.NoError(t, env.Client.Create(ctx, binding))
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), binding)
		_ = env.Client.Delete(context.Background(), role)
	})
}

// startCAPI runs core Cluster API's Cluster, Machine and MachinePool
// controllers and its ClusterCache, watching ns, as its controller manager
// wires them (core/setup), until the test ends. extra sets up more of core
// CAPI's controllers on the same manager and ClusterCache.
func startCAPI(t *testing.T, ns string, log logr.Logger, extra ...capiSetup) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	scheme, err := kubetest.NewScheme()
	require.NoError(t, err)
	// The name must be unique per process: CAPI registers informer names
	// globally and panics on a repeat (go test -count=2). The namespace is a
	// field selector rather than the cache's DefaultNamespaces: a namespaced
	// cache hands out informers that core CAPI's MachineDeployment and
	// MachineSet controllers cannot use ("failed to cast MachineSet informer
	// to SharedIndexInformer").
	cacheOpts := setup.ManagerCacheOptions(scheme, "capi-contract-"+ns, "", 10*time.Minute)
	cacheOpts.DefaultFieldSelector = fields.OneTermEqualSelector("metadata.namespace", ns)
	// Core CAPI reads CRDs (cluster-scoped) for contract versions.
	cacheOpts.ByObject[&apiextensionsv1.CustomResourceDefinition{}] = cache.ByObject{Field: fields.Everything()}
	runCAPIManager(t, ctx, cancel, scheme, "capi-contract", cacheOpts, log, append([]capiSetup{
		func(ctx context.Context, mgr ctrl.Manager, cc clustercache.ClusterCache, opts controller.Options) error {
			return (&capicluster.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: cc,
				RemoteConnectionGracePeriod: 50 * time.Second}).SetupWithManager(ctx, mgr, opts)
		},
		func(ctx context.Context, mgr ctrl.Manager, cc clustercache.ClusterCache, opts controller.Options) error {
			return (&capimachine.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: cc,
				RemoteConditionsGracePeriod: 5 * time.Minute}).SetupWithManager(ctx, mgr, opts)
		},
		func(ctx context.Context, mgr ctrl.Manager, cc clustercache.ClusterCache, opts controller.Options) error {
			return (&capimachinepool.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: cc}).
				SetupWithManager(ctx, mgr, opts)
		},
	}, extra...)...)
}

// runCAPIManager runs a controller manager the way core CAPI's wires its
// controllers (core/setup): default indexes, a ClusterCache named name
// (retrying connections every second, not 30), and the controllers setups
// add, until the test ends.
func runCAPIManager(t *testing.T, ctx context.Context, cancel context.CancelFunc, scheme *runtime.Scheme, name string, cacheOpts cache.Options, log logr.Logger, setups ...capiSetup) {
	t.Helper()
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 scheme,
		Logger:                 log,
		Cache:                  cacheOpts,
		Client:                 setup.ManagerClientOptions(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	require.NoError(t, err)
	require.NoError(t, index.AddDefaultIndexes(ctx, mgr))
	secretClient, err := setup.CreateSecretCachingClient(mgr)
	require.NoError(t, err)
	opts := controller.Options{MaxConcurrentReconciles: 2, SkipNameValidation: ptr.To(true)}
	cc, err := clustercache.SetupWithManager(ctx, mgr, clustercache.Options{
		SecretClient: secretClient,
		Cache:        setup.ClusterCacheCacheOptions(),
		Client:       setup.ClusterCacheClientOptions(name, 20, 30),
	}, opts)
	require.NoError(t, err)
	// The default is 30s between connection attempts; the Cluster turns
	// provisioned shortly after the test starts.
	retry, ok := cc.(interface{ SetConnectionCreationRetryInterval(time.Duration) })
	require.True(t, ok)
	retry.SetConnectionCreationRetryInterval(time.Second)
	for _, setup := range setups {
		require.NoError(t, setup(ctx, mgr, cc, opts))
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if s, ok := cc.(interface{ Shutdown() }); ok {
			s.Shutdown()
		}
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Errorf("cluster-api manager %s did not stop", name)
		}
	})
}

// capiSetup adds controllers to the manager startCAPI runs.
type capiSetup func(ctx context.Context, mgr ctrl.Manager, cc clustercache.ClusterCache, opts controller.Options) error

// startOperator creates the Cluster objects the cluster templates would
// (the operator creates none) and starts the operator.
func startOperator(t *testing.T, o manager.Options) {
	t.Helper()
	ep, err := cluster.Endpoint(cmp.Or(o.Env.CAPIEndpoint, o.RestConfig.Host))
	require.NoError(t, err)
	require.NoError(t, cluster.EnsureObjects(context.Background(), env.Client, cmp.Or(o.WatchNamespace, o.Env.Namespace), o.Config.ClusterID, ep))
	startOperatorOnly(t, o)
}

// startOperatorOnly starts the operator and waits for its startup import,
// which waits for the Cluster to exist.
func startOperatorOnly(t *testing.T, o manager.Options) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	op, err := manager.New(ctx, o)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- op.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("operator did not stop")
		}
	})
	select {
	case <-op.Imported:
	case err := <-done:
		t.Fatalf("operator stopped before import: %v", err)
	case <-time.After(waitLong):
		t.Fatal("import did not finish")
	}
}

func get(t *testing.T, key client.ObjectKey, obj client.Object) bool {
	t.Helper()
	err := env.Client.Get(context.Background(), key, obj)
	if apierrors.IsNotFound(err) {
		return false
	}
	require.NoError(t, err)
	return true
}

// createPool creates an NstanceMachinePool and its MachinePool; drainTimeout
// bounds how long the server waits for a drain of its instances.
func (f *fixture) createPool(t *testing.T, name string, replicas int32, drainTimeout time.Duration) {
	t.Helper()
	f.createPoolOn(t, name, replicas, drainTimeout, shardID)
}

// createPoolOn is createPool over the given shards.
func (f *fixture) createPoolOn(t *testing.T, name string, replicas int32, drainTimeout time.Duration, shards ...string) {
	t.Helper()
	ctx := context.Background()
	labels := map[string]string{clusterv1.ClusterNameLabel: clusterID}
	require.NoError(t, env.Client.Create(ctx, &infrav1.NstanceMachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: labels},
		Spec: infrav1.NstanceMachinePoolSpec{Group: name, Shards: shards, Template: "worker",
			DrainTimeout: &metav1.Duration{Duration: drainTimeout},
			// Every pool of these tests accepts on-demand pods (of the
			// operator's namespace, the default).
			OnDemand: &infrav1.OnDemandSpec{Enabled: true}},
	}))
	// Fields CAPI's defaulting webhook would set are given explicitly: the
	// cluster-name label and the bootstrap data Secret (no bootstrap provider).
	require.NoError(t, env.Client.Create(ctx, &clusterv1.MachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: labels},
		Spec: clusterv1.MachinePoolSpec{
			ClusterName: clusterID, Replicas: ptr.To(replicas),
			Template: clusterv1.MachineTemplateSpec{
				ObjectMeta: clusterv1.ObjectMeta{Labels: labels},
				Spec: clusterv1.MachineSpec{
					ClusterName: clusterID, Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr.To(bootstrapSecret)},
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceMachinePool", Name: name,
					},
				},
			},
		},
	}))
}

func nodeByProviderID(t *testing.T, providerID string) (corev1.Node, bool) {
	t.Helper()
	var nodes corev1.NodeList
	require.NoError(t, env.Client.List(context.Background(), &nodes))
	for _, n := range nodes.Items {
		if n.Spec.ProviderID == providerID {
			return n, true
		}
	}
	return corev1.Node{}, false
}

func instanceState(t *testing.T, sh *shardtest.Shard, id string) nstancev1.InstanceState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := sh.Client(t, tenant).GetInstanceStatus(ctx, &nstancev1.GetInstanceStatusRequest{
		Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: id}})
	if status.Code(err) == codes.NotFound {
		return nstancev1.InstanceState_INSTANCE_STATE_DELETED
	}
	require.NoError(t, err)
	return resp.GetInstance().GetState()
}

// capiLog records what core Cluster API's controllers log, so a test can
// check that a message (such as "Skipping deletion of Kubernetes Node")
// never appeared.
type capiLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *capiLog) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, prefix+" "+args)
	}, funcr.Options{})
}

func (l *capiLog) matching(substr string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return out
}

// instanceEvents follows the shard's WatchInstances stream as a second
// operator would and records, per instance, which stages the server
// announced.
type instanceEvents struct {
	mu   sync.Mutex
	seen map[string][]nstancev1.InstanceEventStatus
}

func watchInstances(t *testing.T, sh *shardtest.Shard) *instanceEvents {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := sh.Client(t, tenant).WatchInstances(ctx, &nstancev1.WatchInstancesRequest{})
	require.NoError(t, err)
	ev := &instanceEvents{seen: map[string][]nstancev1.InstanceEventStatus{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			e, err := stream.Recv()
			if err != nil {
				return
			}
			ev.mu.Lock()
			ev.seen[e.GetInstanceId()] = append(ev.seen[e.GetInstanceId()], e.GetStatus())
			ev.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return ev
}

func (e *instanceEvents) of(id string) []nstancev1.InstanceEventStatus {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.seen[id])
}

// acks records the drains the operator acknowledged.
type acks struct {
	mu  sync.Mutex
	ids map[string]int
}

func (a *acks) record(_, id string, _ bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ids[id]++
}

func (a *acks) count(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ids[id]
}

// events returns the core/v1 Events (the API core CAPI records with) with
// reason about the object named name.
func events(t *testing.T, ns, kind, name, reason string) []corev1.Event {
	t.Helper()
	var list corev1.EventList
	require.NoError(t, env.Client.List(context.Background(), &list, client.InNamespace(ns)))
	var out []corev1.Event
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == kind && e.InvolvedObject.Name == name && e.Reason == reason {
			out = append(out, e)
		}
	}
	return out
}

// nodeEventReasons are the reasons of Events about a Node (the operator's
// drain files them in "default", on the core/v1 API).
func nodeEventReasons(t *testing.T, node string) []string {
	t.Helper()
	var list corev1.EventList
	require.NoError(t, env.Client.List(context.Background(), &list))
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name == node {
			out = append(out, e.Reason)
		}
	}
	return out
}

func createPod(t *testing.T, ns, name, node string, labels map[string]string) {
	t.Helper()
	ctx := context.Background()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []corev1.Container{{Name: "c", Image: "example.invalid/app"}}},
	}
	require.NoError(t, env.Client.Create(ctx, p))
	// Running and ready, as a kubelet would report: the Eviction API lets
	// pending pods go regardless of PodDisruptionBudgets.
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	require.NoError(t, env.Client.Status().Update(ctx, p))
}

// setPDBAllowed plays the disruption controller (not part of envtest).
func setPDBAllowed(t *testing.T, ns, name string, allowed int32) {
	t.Helper()
	require.Eventually(t, func() bool {
		var pdb policyv1.PodDisruptionBudget
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &pdb); err != nil {
			return false
		}
		pdb.Status = policyv1.PodDisruptionBudgetStatus{ObservedGeneration: pdb.Generation, DisruptionsAllowed: allowed,
			CurrentHealthy: 1, DesiredHealthy: 1 - allowed, ExpectedPods: 1}
		return env.Client.Status().Update(context.Background(), &pdb) == nil
	}, waitLong, tick)
}

func podExists(t *testing.T, ns, name string) bool {
	t.Helper()
	return get(t, client.ObjectKey{Namespace: ns, Name: name}, &corev1.Pod{})
}

// TestCoreCAPIAcceptsOperator runs core Cluster API's controllers beside the
// operator. The Cluster's control plane is the operator's
// NstanceControlPlane: core CAPI sees it initialized and available, connects
// to the workload cluster through its kubeconfig Secret and reports the
// Cluster Available. A Machine turns Ready and Available; deleting it makes
// core CAPI drain (honouring a PodDisruptionBudget) and delete its Node
// while the server drains nothing a second time; an instance the server
// deletes is drained once by the operator and its Machine and Node go
// without a second drain. A MachinePool's replica count follows 3 -> 0 -> 2.
func TestCoreCAPIAcceptsOperator(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	bindCAPIWorkloadRole(t, f.ns)
	a := &acks{ids: map[string]int{}}
	f.opts.OnDrainAcknowledged = a.record
	startOperator(t, f.opts)
	logs := &capiLog{}
	startCAPI(t, f.ns, logs.logger())
	t.Cleanup(func() {
		if t.Failed() {
			for _, line := range logs.matching("rror") {
				t.Log(line)
			}
		}
	})
	stream := watchInstances(t, f.shard)
	key := func(name string) client.ObjectKey { return client.ObjectKey{Namespace: f.ns, Name: name} }

	var cluster clusterv1.Cluster
	require.Eventually(t, func() bool {
		return get(t, key(clusterID), &cluster) && ptr.Deref(cluster.Status.Initialization.InfrastructureProvisioned, false) &&
			ptr.Deref(cluster.Status.Initialization.ControlPlaneInitialized, false) &&
			cluster.Status.Phase == string(clusterv1.ClusterPhaseProvisioned)
	}, waitLong, tick, "core CAPI marks the Cluster's infrastructure provisioned and control plane initialized")
	require.Equal(t, "NstanceControlPlane", cluster.Spec.ControlPlaneRef.Kind)
	require.True(t, conditions.IsTrue(&cluster, clusterv1.ClusterControlPlaneInitializedCondition))
	require.True(t, cluster.Spec.ControlPlaneEndpoint.IsValid(), "endpoint surfaced on the Cluster")
	var nc infrav1.NstanceCluster
	require.True(t, get(t, key(clusterID), &nc))
	require.True(t, slices.ContainsFunc(nc.OwnerReferences, func(r metav1.OwnerReference) bool {
		return r.Kind == "Cluster" && r.UID == cluster.UID
	}), "core CAPI owns the NstanceCluster")
	var cp cpv1.NstanceControlPlane
	require.Eventually(t, func() bool {
		return get(t, key(clusterID), &cp) && slices.ContainsFunc(cp.OwnerReferences, func(r metav1.OwnerReference) bool {
			return r.Kind == "Cluster" && r.UID == cluster.UID
		})
	}, waitLong, tick, "core CAPI owns the NstanceControlPlane")
	require.True(t, ptr.Deref(cp.Status.ExternalManagedControlPlane, false))

	// With no workers yet every availability gate of the Cluster is true.
	require.Eventually(t, func() bool {
		return get(t, key(clusterID), &cluster) && conditions.IsTrue(&cluster, clusterv1.AvailableCondition)
	}, waitLong, tick, "core CAPI reports the Cluster Available")
	for _, typ := range []string{clusterv1.ClusterRemoteConnectionProbeCondition, clusterv1.ClusterInfrastructureReadyCondition,
		clusterv1.ClusterControlPlaneAvailableCondition, clusterv1.ClusterWorkersAvailableCondition} {
		require.True(t, conditions.IsTrue(&cluster, typ), typ)
	}

	// The group the standalone Machines join. Its drain deadline is long:
	// the operator's drain of a server-side deletion must not race it.
	f.createPool(t, "solo", 0, 30*time.Second)

	t.Run("deleting a Machine: core CAPI drains and deletes its Node, no second drain", func(t *testing.T) {
		m, nm := f.createMachine(t, "solo-1")
		require.Eventually(t, func() bool {
			return get(t, key(m.Name), m) && conditions.IsTrue(m, clusterv1.MachineReadyCondition) &&
				conditions.IsTrue(m, clusterv1.MachineAvailableCondition)
		}, waitLong, tick, "core CAPI reports the Machine Ready and Available: %+v", m.Status.Conditions)
		require.True(t, conditions.IsTrue(m, clusterv1.MachineNodeHealthyCondition))
		require.Eventually(t, func() bool {
			return get(t, key(clusterID), &cluster) && conditions.IsTrue(&cluster, clusterv1.ClusterWorkerMachinesReadyCondition) &&
				ptr.Deref(cluster.Status.Workers.ReadyReplicas, 0) == 1 && conditions.IsTrue(&cluster, clusterv1.AvailableCondition)
		}, waitLong, tick, "the Cluster counts the Ready worker Machine and stays Available")
		node, ok := nodeByProviderID(t, nm.Spec.ProviderID)
		require.True(t, ok)
		require.Equal(t, node.Name, m.Status.NodeRef.Name)
		instanceID := nm.Status.InstanceID

		createPod(t, f.ns, "app", node.Name, nil)
		createPod(t, f.ns, "guarded", node.Name, map[string]string{"app": "guarded"})
		require.NoError(t, env.Client.Create(ctx, &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "guarded"},
			Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)),
				Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "guarded"}}},
		}))
		setPDBAllowed(t, f.ns, "guarded", 0)

		require.NoError(t, env.Client.Delete(ctx, m))
		// CAPI cordons and evicts what it may; the PDB holds the guarded
		// pod, so the instance keeps running.
		require.Eventually(t, func() bool {
			var n corev1.Node
			return !podExists(t, f.ns, "app") && get(t, client.ObjectKey{Name: node.Name}, &n) && n.Spec.Unschedulable
		}, waitLong, tick, "core CAPI cordons the Node and evicts the unguarded pod")
		require.Eventually(t, func() bool {
			return get(t, key(m.Name), m) && conditions.GetReason(m, clusterv1.MachineDeletingCondition) == clusterv1.MachineDeletingDrainingNodeReason
		}, waitLong, tick, "the Machine reports its Node draining")
		require.True(t, podExists(t, f.ns, "guarded"), "the PDB refuses the eviction")
		require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_RUNNING, instanceState(t, f.shard, instanceID))

		setPDBAllowed(t, f.ns, "guarded", 1)
		require.Eventually(t, func() bool {
			return !get(t, key("solo-1"), &clusterv1.Machine{}) && !get(t, key("solo-1"), &infrav1.NstanceMachine{})
		}, drainWait, tick, "core CAPI finishes the drain, deletes the NstanceMachine and the Machine")
		require.False(t, podExists(t, f.ns, "guarded"))
		require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_DELETED, instanceState(t, f.shard, instanceID))
		_, err := f.provider.Status(ctx, instanceID)
		require.ErrorIs(t, err, provider.ErrNotFound, "the VM is gone from the provider")
		_, ok = nodeByProviderID(t, nm.Spec.ProviderID)
		require.False(t, ok, "core CAPI deletes the Node")
		require.NotEmpty(t, events(t, f.ns, "Machine", "solo-1", "SuccessfulDrainNode"), "core CAPI drained the Node")
		require.Empty(t, logs.matching("Skipping deletion of Kubernetes Node"))

		// No second drain: the server never announced one and the operator
		// never drained or acknowledged anything for this instance.
		require.Eventually(t, func() bool {
			return slices.Contains(stream.of(instanceID), nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETED)
		}, waitLong, tick)
		require.NotContains(t, stream.of(instanceID), nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION)
		require.Zero(t, a.count(instanceID))
		require.NotContains(t, nodeEventReasons(t, node.Name), drain.ReasonDrainStarted)
	})

	t.Run("deleted on the server: the operator drains once, core CAPI deletes the Node without draining", func(t *testing.T) {
		m, nm := f.createMachine(t, "solo-2")
		instanceID := nm.Status.InstanceID
		node, ok := nodeByProviderID(t, nm.Spec.ProviderID)
		require.True(t, ok)
		createPod(t, f.ns, "app-2", node.Name, nil)

		resp, err := f.shard.Client(t, tenant).DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: instanceID})
		require.NoError(t, err)
		require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION, resp.GetInstance().GetState())
		require.Eventually(t, func() bool {
			_, ok := nodeByProviderID(t, nm.Spec.ProviderID)
			return !ok && !get(t, key(m.Name), &clusterv1.Machine{}) && !get(t, key(m.Name), &infrav1.NstanceMachine{})
		}, waitLong, tick, "Machine, NstanceMachine and Node are gone")
		require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_DELETED, instanceState(t, f.shard, instanceID))
		require.False(t, podExists(t, f.ns, "app-2"), "the operator's drain evicted the pod")
		require.Equal(t, 1, a.count(instanceID), "the operator drained once")
		require.Contains(t, nodeEventReasons(t, node.Name), drain.ReasonDrained)
		require.Empty(t, events(t, f.ns, "Machine", m.Name, "SuccessfulDrainNode"), "core CAPI did not drain again")
		require.Empty(t, logs.matching("Skipping deletion of Kubernetes Node"))
	})

	t.Run("MachinePool scaled 3 -> 0 -> 2", func(t *testing.T) {
		f.createPool(t, "workers", 3, 100*time.Millisecond)
		var mp clusterv1.MachinePool
		waitReplicas := func(n int32) {
			t.Helper()
			require.Eventually(t, func() bool {
				return get(t, key("workers"), &mp) && mp.Status.Replicas != nil && *mp.Status.Replicas == n &&
					len(mp.Spec.ProviderIDList) == int(n) && len(mp.Status.NodeRefs) == int(n)
			}, waitLong, tick, "core CAPI reports %d replicas", n)
		}
		waitReplicas(3)
		require.Equal(t, string(clusterv1.MachinePoolPhaseRunning), mp.Status.Phase)
		require.True(t, ptr.Deref(mp.Status.Initialization.InfrastructureProvisioned, false))
		var nmp infrav1.NstanceMachinePool
		require.True(t, get(t, key("workers"), &nmp))
		require.ElementsMatch(t, nmp.Spec.ProviderIDList, mp.Spec.ProviderIDList, "CAPI copies the provider IDs")
		var refNames, nodeNames []string
		for _, r := range mp.Status.NodeRefs {
			refNames = append(refNames, r.Name)
		}
		for _, pid := range nmp.Spec.ProviderIDList {
			n, ok := nodeByProviderID(t, pid)
			require.True(t, ok, "Node for %s", pid)
			nodeNames = append(nodeNames, n.Name)
		}
		require.ElementsMatch(t, nodeNames, refNames, "nodeRefs are the Nodes with the pool's provider IDs")
		old := slices.Clone(nmp.Spec.ProviderIDList)

		scale := func(n int32) {
			t.Helper()
			require.True(t, get(t, key("workers"), &mp))
			patch := client.MergeFrom(mp.DeepCopy())
			mp.Spec.Replicas = ptr.To(n)
			require.NoError(t, env.Client.Patch(ctx, &mp, patch))
		}
		scale(0)
		waitReplicas(0)
		require.True(t, ptr.Deref(mp.Status.Initialization.InfrastructureProvisioned, false), "provisioned stays true through the scale")
		require.True(t, get(t, key("workers"), &nmp))
		require.True(t, nmp.Status.Ready, "ready latches")
		require.Eventually(t, func() bool {
			for _, pid := range old {
				if _, ok := nodeByProviderID(t, pid); ok {
					return false
				}
			}
			return true
		}, waitLong, tick, "core CAPI deletes the Nodes of removed instances")

		scale(2)
		waitReplicas(2)
		require.True(t, get(t, key("workers"), &nmp))
		require.Equal(t, int32(2), nmp.Status.Replicas)

		// Core CAPI v1.14 leaves MachinePools out of the Cluster's
		// WorkersAvailable (its MachinePool controller sets no Available
		// condition yet), so the Cluster stays Available with them.
		require.True(t, get(t, key(clusterID), &cluster))
		require.True(t, conditions.IsTrue(&cluster, clusterv1.AvailableCondition))
		require.True(t, conditions.IsTrue(&cluster, clusterv1.ClusterWorkersAvailableCondition))
	})
}

// createMachine creates an NstanceMachine and its Machine in group "solo"
// and waits until core CAPI reports the Machine Running with a Node.
func (f *fixture) createMachine(t *testing.T, name string) (*clusterv1.Machine, *infrav1.NstanceMachine) {
	t.Helper()
	ctx := context.Background()
	labels := map[string]string{clusterv1.ClusterNameLabel: clusterID}
	require.NoError(t, env.Client.Create(ctx, &infrav1.NstanceMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: labels},
		Spec:       infrav1.NstanceMachineSpec{Group: "solo"},
	}))
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: labels},
		Spec: clusterv1.MachineSpec{ClusterName: clusterID, FailureDomain: shardID,
			Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr.To(bootstrapSecret)},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceMachine", Name: name}},
	}
	require.NoError(t, env.Client.Create(ctx, m))
	key := client.ObjectKey{Namespace: f.ns, Name: name}
	require.Eventually(t, func() bool {
		return get(t, key, m) && m.Status.Phase == string(clusterv1.MachinePhaseRunning) && m.Status.NodeRef.IsDefined()
	}, waitLong, tick, "core CAPI reports the Machine Running with a nodeRef")
	require.True(t, ptr.Deref(m.Status.Initialization.InfrastructureProvisioned, false))
	nm := &infrav1.NstanceMachine{}
	require.True(t, get(t, key, nm))
	require.True(t, slices.ContainsFunc(nm.OwnerReferences, func(r metav1.OwnerReference) bool {
		return r.Kind == "Machine" && r.UID == m.UID
	}), "core CAPI owns the NstanceMachine")
	require.NotEmpty(t, nm.Spec.ProviderID)
	require.Equal(t, nm.Spec.ProviderID, m.Spec.ProviderID, "CAPI copies the provider ID")
	require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_RUNNING, instanceState(t, f.shard, nm.Status.InstanceID))
	return m, nm
}
