package manager

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	cpv1 "github.com/nstance-dev/nstance/api/controlplane/v1beta1"
	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/bootstrap"
	"github.com/nstance-dev/nstance/internal/operator/capacity"
	"github.com/nstance-dev/nstance/internal/operator/cluster"
	"github.com/nstance-dev/nstance/internal/operator/config"
	"github.com/nstance-dev/nstance/internal/operator/controlplane"
	"github.com/nstance-dev/nstance/internal/operator/drain"
	"github.com/nstance-dev/nstance/internal/operator/importer"
	"github.com/nstance-dev/nstance/internal/operator/ledger"
	"github.com/nstance-dev/nstance/internal/operator/machine"
	"github.com/nstance-dev/nstance/internal/operator/machinepool"
	"github.com/nstance-dev/nstance/internal/operator/metrics"
	"github.com/nstance-dev/nstance/internal/operator/nodecarry"
	"github.com/nstance-dev/nstance/internal/operator/nodejoin"
	"github.com/nstance-dev/nstance/internal/operator/ondemand"
	"github.com/nstance-dev/nstance/internal/operator/rollguard"
	"github.com/nstance-dev/nstance/internal/operator/shardconn"
	"github.com/nstance-dev/nstance/internal/operator/shardgroup"
	"github.com/nstance-dev/nstance/internal/operator/watch"
	"github.com/nstance-dev/nstance/internal/operator/watchfilter"
	opwebhook "github.com/nstance-dev/nstance/internal/operator/webhook"
	"github.com/nstance-dev/nstance/internal/operator/workload"
)

// RBAC the wiring itself needs: the leader election Lease, the bootstrap
// ConfigMap and Secrets, and Events (both APIs, for the broadcaster's
// fallback). Secrets are granted only in the operator's namespace: the
// namespace= markers generate a Role in RoleNamespace that the chart and
// the tests bind in the operator's actual namespace, and the manager's
// cache reads Secrets in that namespace only.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",namespace=nstance-system,resources=secrets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch;update
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch;update

// RoleNamespace is the namespace the generated namespaced Role
// (config/rbac/role.yaml) names; deployments bind its rules in the
// operator's own namespace instead.
const RoleNamespace = "nstance-system"

// LeaderElectionID is the Lease the operator replicas compete for.
const LeaderElectionID = "nstance-operator-leader-election"

// Concurrency is the number of concurrent reconciles of each controller.
type Concurrency struct {
	ShardGroup, MachinePool, Machine, OnDemand int
}

// Options configure the operator.
type Options struct {
	Config *config.Config
	// Env names the operator's own namespace (NSTANCE_NAMESPACE: its
	// Secrets, ConfigMaps and Lease) and objects.
	Env        config.Env
	RestConfig *rest.Config
	// WatchNamespace (--namespace) is the namespace whose Cluster API and
	// Nstance objects the operator reconciles; empty means every namespace,
	// as clusterctl expects. The operator's Cluster (named after its cluster
	// ID), imported pools and on-demand objects live in WatchNamespace, or
	// in Env.Namespace when it is empty.
	WatchNamespace string
	// WatchFilter (--watch-filter) restricts the operator to Nstance
	// objects labelled cluster.x-k8s.io/watch-filter with it; empty means
	// every object.
	WatchFilter watchfilter.Filter

	// MetricsAddr is the diagnostics address (--diagnostics-address):
	// /metrics, and with secure serving also /debug/pprof/; "0" or empty
	// disables it.
	MetricsAddr string
	// InsecureMetrics (--insecure-diagnostics) serves MetricsAddr over
	// plain HTTP without authentication. Otherwise it is HTTPS (a
	// self-signed certificate) and every request is authenticated with a
	// TokenReview and authorized with a SubjectAccessReview, as
	// kubebuilder and every Cluster API provider do.
	InsecureMetrics bool
	// TLSOpts (--tls-min-version, --tls-cipher-suites) apply to the webhook
	// server and the secure diagnostics server.
	TLSOpts []func(*tls.Config)
	// SyncPeriod (--sync-period) is how often the cache resyncs every
	// object; zero means controller-runtime's default.
	SyncPeriod time.Duration
	// Concurrency is each controller's number of workers
	// (--<kind>-concurrency); zero means Workers.
	Concurrency Concurrency
	ProbeAddr   string
	// PprofAddr serves net/http/pprof (controller-runtime's pprof server);
	// empty disables it.
	PprofAddr   string
	LeaderElect bool

	// Registrar defaults to the gRPC registration client.
	Registrar bootstrap.Registrar
	// MetricsRegistry defaults to controller-runtime's registry.
	MetricsRegistry prometheus.Registerer
	Log             logr.Logger

	// Tuning, mostly for tests. Zero values pick production defaults.
	MaxBackoff         time.Duration
	RetryDelay         time.Duration
	ImportWait         time.Duration
	Workers            int
	TokenTTL           time.Duration
	AfterKeypairStored func() error
	// SkipNameValidation allows several operators in one test process.
	SkipNameValidation bool
	// LeaseDurations shorten leader election in tests.
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// DrainRetryInterval separates eviction passes of one drain; zero means 2s.
	DrainRetryInterval time.Duration
	// DisableWebhooks turns the admission webhook server off (--disable-webhooks).
	DisableWebhooks bool
	// WebhookHost, WebhookPort and WebhookCertDir configure the webhook
	// server; zero values mean controller-runtime's defaults (all
	// interfaces, 9443, /tmp/k8s-webhook-server/serving-certs).
	WebhookHost    string
	WebhookPort    int
	WebhookCertDir string
	// MachinePollInterval re-reads pending instances of NstanceMachines; zero means 2s.
	MachinePollInterval time.Duration
	// OnDrainAcknowledged observes acknowledged drains (tests, benchmarks).
	OnDrainAcknowledged func(shard, instanceID string, skipped bool)
	// WorkloadMode says where Nodes and Pods are (--workload-cluster):
	// in-cluster (empty too) or management, through the Cluster's
	// <cluster>-kubeconfig Secret.
	WorkloadMode workload.Mode
	// WorkloadConnectRetry is the pause after a failed connection to the
	// workload cluster in management mode; zero means 30s.
	WorkloadConnectRetry time.Duration
	// ShardDialOptions are added to every shard connection (tests).
	ShardDialOptions []grpc.DialOption
	// JoinTimeout is the join deadline (--join-timeout, 10m from the CLI):
	// an instance whose Node is not Ready that long after its agent's first
	// health report is replaced. Zero disables it.
	JoinTimeout time.Duration
	// OnDemandRecheck is how often a refused on-demand pod is looked at
	// again; zero means ondemand.DefaultRecheck.
	OnDemandRecheck time.Duration
	// JoinInterval separates join-deadline passes; zero means JoinTimeout/10
	// within [1s, 10s].
	JoinInterval time.Duration
	// CarryInterval separates label-carry passes; zero means 5s.
	CarryInterval time.Duration
}

// Operator is a configured, not yet started operator.
type Operator struct {
	opts    Options
	Manager manager.Manager
	Conns   *shardconn.Manager
	Cache   *watch.Cache
	Metrics *metrics.Metrics
	trigger chan event.GenericEvent
	direct  client.Client
	ledger  *ledger.Ledger
	Drain   *drain.Coordinator
	// Workload reaches the workload cluster of Cluster (Nodes, Pods).
	Workload workload.Access
	// Cluster is the Cluster API Cluster the operator serves.
	Cluster client.ObjectKey
	// Imported is closed once the startup import finished.
	Imported chan struct{}
	// ImportResult is valid once Imported is closed.
	ImportResult importer.Result
}

// NewScheme returns the scheme with every kind the operator touches.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, clusterv1.AddToScheme, infrav1.AddToScheme, cpv1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, fmt.Errorf("build scheme: %w", err)
		}
	}
	return s, nil
}

// New builds the manager, controllers and runnables.
func New(ctx context.Context, o Options) (*Operator, error) {
	if o.Config == nil || o.RestConfig == nil {
		return nil, errors.New("operator: config and rest config are required")
	}
	scheme, err := NewScheme()
	if err != nil {
		return nil, err
	}
	restCfg := rest.CopyConfig(o.RestConfig)
	if o.Env.K8sJSON {
		restCfg.ContentType = runtime.ContentTypeJSON
		restCfg.AcceptContentTypes = runtime.ContentTypeJSON
	}
	reg := o.MetricsRegistry
	if reg == nil {
		reg = ctrlmetrics.Registry
	}
	m, err := metrics.New(reg)
	if err != nil {
		return nil, err
	}
	ns := o.Env.Namespace
	// watchNS holds the reconciled objects ("" = all); clusterNS the
	// operator's Cluster, imports and on-demand objects.
	watchNS := o.WatchNamespace
	clusterNS := cmp.Or(watchNS, ns)
	mode, err := workload.ParseMode(string(o.WorkloadMode))
	if err != nil {
		return nil, fmt.Errorf("workload cluster mode %w", err)
	}
	byObject := map[client.Object]cache.ByObject{
		// Secrets only ever in the operator's namespace: the RBAC grants
		// them nowhere else (namespaced Role).
		&corev1.Secret{}: {Namespaces: map[string]cache.Config{ns: {}, clusterNS: {}}},
	}
	defaultNamespaces := map[string]cache.Config{cache.AllNamespaces: {}}
	if watchNS != "" {
		defaultNamespaces = map[string]cache.Config{watchNS: {}}
	}
	if mode == workload.InCluster {
		// On-demand pods may live in any namespace.
		byObject[&corev1.Pod{}] = cache.ByObject{Namespaces: map[string]cache.Config{cache.AllNamespaces: {}}}
	}
	mopts := ctrl.Options{
		Scheme:                        scheme,
		Logger:                        o.Log,
		Metrics:                       diagnostics(o),
		HealthProbeBindAddress:        cmp.Or(o.ProbeAddr, "0"),
		PprofBindAddress:              o.PprofAddr,
		LeaderElection:                o.LeaderElect,
		LeaderElectionID:              LeaderElectionID,
		LeaderElectionNamespace:       ns,
		LeaderElectionReleaseOnCancel: true,
		Cache: cache.Options{
			SyncPeriod:        syncPeriod(o.SyncPeriod),
			DefaultNamespaces: defaultNamespaces,
			ByObject:          byObject,
		},
		Controller: crconfig.Controller{SkipNameValidation: ptr.To(o.SkipNameValidation)},
	}
	if !o.DisableWebhooks {
		mopts.WebhookServer = webhook.NewServer(webhook.Options{Host: o.WebhookHost, Port: o.WebhookPort, CertDir: o.WebhookCertDir, TLSOpts: o.TLSOpts})
	}
	if o.LeaseDuration > 0 {
		mopts.LeaseDuration, mopts.RenewDeadline, mopts.RetryPeriod = &o.LeaseDuration, &o.RenewDeadline, &o.RetryPeriod
	}
	mgr, err := ctrl.NewManager(restCfg, mopts)
	if err != nil {
		return nil, fmt.Errorf("create controller manager: %w", err)
	}
	direct, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("create API client: %w", err)
	}
	shardAddrs := map[string]string{}
	for id, s := range o.Config.Shards {
		shardAddrs[id] = s.OperatorAddr
	}
	op := &Operator{
		opts: o, Manager: mgr, Metrics: m, Cache: watch.NewCache(),
		trigger: make(chan event.GenericEvent, 1024), direct: direct,
		ledger:   ledger.New(direct, clusterNS, ""),
		Imported: make(chan struct{}),
		Cluster:  client.ObjectKey{Namespace: clusterNS, Name: o.Config.ClusterID},
	}
	op.Conns = shardconn.New(shardconn.Options{
		Shards: shardAddrs, MaxBackoff: o.MaxBackoff, ClusterID: o.Config.ClusterID, Metrics: m,
		Log: o.Log.WithName("shardconn"), DialOptions: o.ShardDialOptions,
		StoreCert: func(ctx context.Context, certPEM, keyPEM, caPEM []byte) error {
			return bootstrap.StoreCert(ctx, direct, ns, o.Env.CertSecret, certPEM, keyPEM, caPEM)
		},
	})
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return nil, err
	}
	// A replica is ready to take the only traffic the Services send it,
	// admission requests, once its webhook server serves (at once without
	// webhooks), as in kubebuilder's and Cluster API's managers. Shard
	// health does not gate it: with failurePolicy Fail, one shard's outage
	// would take away the webhook endpoint and block every pool edit. Shard
	// health shows in nstance_operator_shard_up and the shard groups'
	// ShardReachable condition instead.
	ready := healthz.Ping
	if !o.DisableWebhooks {
		ready = mgr.GetWebhookServer().StartedChecker()
	}
	if err := mgr.AddReadyzCheck("webhook", ready); err != nil {
		return nil, err
	}
	recorder := mgr.GetEventRecorder("nstance-operator")
	sg := &shardgroup.Reconciler{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Conns: op.Conns, Groups: op.Cache, Recorder: recorder, Metrics: m, RetryDelay: o.RetryDelay,
		WatchFilter: o.WatchFilter,
		Ledger:      op.ledger,
	}
	if err := sg.SetupWithManager(mgr, op.trigger, cmp.Or(o.Concurrency.ShardGroup, o.Workers)); err != nil {
		return nil, fmt.Errorf("set up shard group controller: %w", err)
	}
	catalog := &capacity.Catalog{Shards: capacity.Shards{Conns: op.Conns}}
	pool := &machinepool.Reconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Ledger: op.ledger, Conns: op.Conns, Recorder: recorder, Capacity: catalog, WatchFilter: o.WatchFilter,
		SyncShardGroup: sg.SyncNow}
	if err := pool.SetupWithManager(ctx, mgr, cmp.Or(o.Concurrency.MachinePool, o.Workers)); err != nil {
		return nil, fmt.Errorf("set up pool controller: %w", err)
	}
	tmpl := &capacity.TemplateReconciler{Client: mgr.GetClient(), Catalog: catalog, Shards: op.Conns.ShardIDs(), WatchFilter: o.WatchFilter}
	if err := tmpl.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up machine template controller: %w", err)
	}
	cc := &cluster.Reconciler{Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Shards: op.Conns.ShardIDs(), Conns: op.Conns, WatchFilter: o.WatchFilter,
		Ledger: op.ledger, Recorder: recorder, Cluster: op.Cluster, Poll: min(cmp.Or(o.RetryDelay, 2*time.Second), 2*time.Second)}
	if err := cc.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up cluster controller: %w", err)
	}
	server, caData, err := controlplane.APIServerFrom(o.RestConfig)
	if err != nil {
		return nil, err
	}
	cp := &controlplane.Reconciler{
		// In management mode the kubeconfig Secret points at the workload
		// cluster and is the user's; the operator's own API server is not it.
		WatchFilter: o.WatchFilter,
		Client:      mgr.GetClient(), ManageKubeconfig: o.Env.CAPIEndpoint == "" && mode == workload.InCluster,
		ServiceAccount: o.Env.CAPIServiceAccount, APIServer: server, CAData: caData, TokenTTL: o.TokenTTL,
	}
	if err := cp.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up control plane controller: %w", err)
	}
	if err := drain.SetupIndexes(ctx, mgr); err != nil {
		return nil, err
	}
	if err := watch.SetupIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
		return nil, err
	}
	switch mode {
	case workload.Management:
		op.Workload, err = workload.NewRemote(ctx, mgr, workload.RemoteOptions{
			Namespace: clusterNS, ClusterName: o.Config.ClusterID, ConnectRetry: o.WorkloadConnectRetry, Log: o.Log.WithName("workload"),
		})
	default:
		op.Workload, err = workload.NewLocal(ctx, mgr, restCfg)
	}
	if err != nil {
		return nil, err
	}
	op.Drain = &drain.Coordinator{
		Workload: op.Workload, Cluster: op.Cluster,
		Conns: op.Conns, Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Recorder: recorder, Namespace: watchNS,
		Log: o.Log.WithName("drain"), RetryInterval: o.DrainRetryInterval, MaxBackoff: o.MaxBackoff,
		OnAcknowledged: o.OnDrainAcknowledged, Metrics: m,
	}
	if err := m.WatchDrains(op.Drain.Pending); err != nil {
		return nil, err
	}
	op.Drain.ClusterName = o.Config.ClusterID
	if err := op.Drain.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up drain controller: %w", err)
	}
	if !o.DisableWebhooks {
		if err := opwebhook.Setup(mgr); err != nil {
			return nil, fmt.Errorf("set up NstanceMachinePool webhook: %w", err)
		}
	}
	var defaultShard string
	if ids := o.Config.ShardIDs(); len(ids) > 0 {
		defaultShard = ids[0]
	}
	mr := &machine.Reconciler{WatchFilter: o.WatchFilter, Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Conns: op.Conns, Recorder: recorder, Namespace: watchNS,
		DefaultShard: defaultShard, PollInterval: o.MachinePollInterval, Log: o.Log.WithName("machine")}
	if err := mr.SetupWithManager(mgr, cmp.Or(o.Concurrency.Machine, o.Workers)); err != nil {
		return nil, fmt.Errorf("set up machine controller: %w", err)
	}
	od := &ondemand.Reconciler{WatchFilter: o.WatchFilter, Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Workload: op.Workload, Namespace: clusterNS,
		ClusterName: o.Config.ClusterID, Namespaces: o.Config.OnDemandNamespaces, Recheck: o.OnDemandRecheck, Log: o.Log.WithName("ondemand")}
	if err := od.SetupWithManager(mgr, cmp.Or(o.Concurrency.OnDemand, o.Workers)); err != nil {
		return nil, fmt.Errorf("set up on-demand controller: %w", err)
	}
	if o.JoinTimeout > 0 {
		if err := mgr.Add(&nodejoin.Runner{
			Shards: op.Conns, Workload: op.Workload, Cluster: op.Cluster, ClusterID: o.Config.ClusterID,
			Client: mgr.GetClient(), Namespace: watchNS, Recorder: recorder, Timeout: o.JoinTimeout, Interval: o.JoinInterval,
			Log: o.Log.WithName("nodejoin"),
		}); err != nil {
			return nil, fmt.Errorf("set up join deadline: %w", err)
		}
	}
	guard := &rollguard.Reconciler{WatchFilter: o.WatchFilter, Client: mgr.GetClient(), Workload: op.Workload, Cluster: op.Cluster, Log: o.Log.WithName("rollguard")}
	if err := guard.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("set up autoscaler scale-down guard: %w", err)
	}
	carry := &nodecarry.Runner{
		Shards: op.Conns, Streams: op.Conns, Workload: op.Workload, Cluster: op.Cluster, Client: mgr.GetClient(), Namespace: watchNS,
		Policy: nodecarry.Policy{
			LabelPrefixes: o.Config.CarryLabelPrefixes, TaintPrefixes: o.Config.CarryTaintPrefixes,
			Settle: nodecarry.DefaultSettle, Window: nodecarry.DefaultWindow, TTL: nodecarry.DefaultTTL, Max: nodecarry.DefaultMax,
		},
		Interval: o.CarryInterval, Log: o.Log.WithName("nodecarry"),
	}
	if carry.Enabled() {
		if err := mgr.Add(carry); err != nil {
			return nil, fmt.Errorf("set up label carry: %w", err)
		}
	}
	if err := mgr.Add(manager.RunnableFunc(op.sync)); err != nil {
		return nil, err
	}
	return op, nil
}

// Start runs the operator until ctx ends or leadership is lost; both it and
// a fatal sync error return an error.
func (op *Operator) Start(ctx context.Context) error {
	return op.Manager.Start(ctx)
}

// sync is the leader-only runnable: registration, connections, watches
// and the startup import. An error is fatal.
func (op *Operator) sync(ctx context.Context) error {
	o := op.opts
	log := o.Log.WithName("sync")
	shards := make([]bootstrap.Shard, 0, len(o.Config.Shards))
	for _, id := range o.Config.ShardIDs() {
		shards = append(shards, bootstrap.Shard{ID: id, Addr: o.Config.Shards[id].RegistrationAddr})
	}
	registrar := o.Registrar
	if registrar == nil {
		registrar = bootstrap.GRPCRegistrar{}
	}
	creds, err := bootstrap.Ensure(ctx, op.direct, bootstrap.Options{
		Namespace: o.Env.Namespace, CAConfigMap: o.Env.CAConfigMap, KeySecret: o.Env.KeySecret,
		NonceSecret: o.Env.NonceSecret, CertSecret: o.Env.CertSecret, ClusterID: o.Config.ClusterID,
		Shards: shards, Registrar: registrar, AfterKeypairStored: o.AfterKeypairStored, Log: o.Log.WithName("bootstrap"),
	})
	if err != nil {
		return fmt.Errorf("operator registration: %w", err)
	}
	reader := op.Manager.GetClient()
	// Groups left on a shard (removed from the config, or abandoned while
	// unreachable) are deleted when the shard is back.
	reaper := &shardgroup.Reaper{Conns: op.Conns, Ledger: op.ledger, Reader: op.Manager.GetAPIReader(), Log: o.Log.WithName("orphans")}
	op.Conns.OnChange(func(shard string, up bool) {
		if up {
			reaper.Wake()
		}
		go func() {
			if err := shardgroup.TriggerShard(ctx, reader, op.trigger, o.WatchNamespace, shard); err != nil && ctx.Err() == nil {
				log.Error(err, "requeue shard groups after health change", "shard", shard)
			}
		}()
	})
	if err := op.Conns.Start(ctx, creds); err != nil {
		return err
	}
	// Cluster objects are the user's (the cluster templates declare the
	// Cluster, NstanceCluster and NstanceControlPlane): the operator creates
	// none, so a deleted Cluster stays deleted across a restart.
	w := &watch.Watcher{
		Conns: op.Conns, Cache: op.Cache, Client: op.Manager.GetClient(), Recorder: op.Manager.GetEventRecorder("nstance-operator"),
		Namespace: o.WatchNamespace, ClusterNamespace: op.Cluster.Namespace, ClusterName: o.Config.ClusterID, Trigger: op.trigger, Metrics: op.Metrics,
		Log: o.Log.WithName("watch"), MaxBackoff: o.MaxBackoff,
	}
	w.Start(ctx)
	op.Drain.Start(ctx)
	reaped := make(chan struct{})
	go func() {
		defer close(reaped)
		reaper.Run(ctx)
	}()
	im := &importer.Importer{
		Client: op.direct, Reader: op.Manager.GetAPIReader(), Conns: op.Conns, Ledger: op.ledger,
		Namespace: op.Cluster.Namespace, WatchNamespace: o.WatchNamespace, WatchFilter: o.WatchFilter, ClusterName: o.Config.ClusterID, Metrics: op.Metrics, Log: o.Log.WithName("import"),
		Wait: o.ImportWait,
	}
	res, err := im.Run(ctx)
	op.ImportResult = res
	close(op.Imported)
	if err != nil && ctx.Err() == nil {
		// Import problems (a name clash, an API error) are reported but do
		// not stop syncing what Kubernetes already has.
		log.Error(err, "startup import incomplete")
	}
	<-ctx.Done()
	<-reaped
	return nil
}
