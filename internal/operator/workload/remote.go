package workload

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// RemoteOptions configure the Management access.
type RemoteOptions struct {
	// Namespace and ClusterName name the one Cluster API Cluster the
	// operator serves; other Clusters get no connection.
	Namespace, ClusterName string
	// ConnectRetry is the pause after a failed connection attempt (no
	// Secret yet, API server down); zero means ClusterCache's 30s.
	ConnectRetry time.Duration
	Log          logr.Logger
}

// Remote is the Management access: core Cluster API's ClusterCache connects
// to the cluster of each Cluster's <cluster>-kubeconfig Secret once the
// Cluster's infrastructure is provisioned, health-probes it, and drops and
// re-creates the connection when the probe fails or the credentials are
// refused.
type Remote struct {
	cc     clustercache.ClusterCache
	mgr    ctrl.Manager
	log    logr.Logger
	ctx    context.Context
	cancel context.CancelFunc

	mu        sync.Mutex
	policies  map[client.ObjectKey]policyEntry
	recorders map[client.ObjectKey]*remoteRecorder
	watches   map[client.ObjectKey][]clustercache.Watcher
}

type policyEntry struct {
	cfg    *rest.Config
	policy rest.Interface
}

type remoteRecorder struct {
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder
}

// NewRemote sets the ClusterCache up with mgr. Kubeconfig Secrets are read
// through mgr's client, whose cache must cover Secrets in o.Namespace.
func NewRemote(ctx context.Context, mgr ctrl.Manager, o RemoteOptions) (*Remote, error) {
	cc, err := clustercache.SetupWithManager(ctx, mgr, clustercache.Options{
		SecretClient: mgr.GetClient(),
		ClusterFilter: func(c *clusterv1.Cluster) bool {
			return c.Namespace == o.Namespace && c.Name == o.ClusterName
		},
		Cache: clustercache.CacheOptions{Indexes: []clustercache.CacheOptionsIndex{{
			Object: &corev1.Node{}, Field: NodeProviderIDIndex, ExtractValue: NodeProviderID,
		}}},
		Client: clustercache.ClientOptions{UserAgent: "nstance-operator"},
	}, controller.Options{})
	if err != nil {
		return nil, fmt.Errorf("set up workload cluster cache: %w", err)
	}
	if o.ConnectRetry > 0 {
		// Not part of the ClusterCache interface; tests shorten it.
		if s, ok := cc.(interface{ SetConnectionCreationRetryInterval(time.Duration) }); ok {
			s.SetConnectionCreationRetryInterval(o.ConnectRetry)
		}
	}
	rctx, cancel := context.WithCancel(context.Background())
	r := &Remote{cc: cc, mgr: mgr, log: o.Log, ctx: rctx, cancel: cancel,
		policies: map[client.ObjectKey]policyEntry{}, recorders: map[client.ObjectKey]*remoteRecorder{},
		watches: map[client.ObjectKey][]clustercache.Watcher{}}
	// Watches live in the per-cluster cache, which a reconnection replaces:
	// the ClusterCache announces every connection, and each one gets the
	// registered watches again.
	src := cc.GetClusterSource("workload-watches", func(_ context.Context, o client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(o)}}
	})
	if err := ctrl.NewControllerManagedBy(mgr).Named("workload-watches").WatchesRawSource(src).
		Complete(reconcile.Func(r.rewatch)); err != nil {
		return nil, fmt.Errorf("set up workload watch controller: %w", err)
	}
	if err := mgr.Add(r); err != nil {
		return nil, err
	}
	return r, nil
}

// Mode is Management.
func (r *Remote) Mode() Mode { return Management }

// Start waits for the manager to stop and then stops the per-cluster
// caches and the Event broadcasters (manager.Runnable). The ClusterCache
// starts its caches outside the manager, so without this their informers
// would outlive the operator (several operators run in one test process).
func (r *Remote) Start(ctx context.Context) error {
	<-ctx.Done()
	if s, ok := r.cc.(interface{ Shutdown() }); ok {
		s.Shutdown()
	}
	r.cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.recorders {
		rec.broadcaster.Shutdown()
	}
	return nil
}

// NeedLeaderElection is false: shutting down is every replica's business.
func (r *Remote) NeedLeaderElection() bool { return false }

// Cluster returns the connected workload cluster of key.
func (r *Remote) Cluster(ctx context.Context, key client.ObjectKey) (*Cluster, error) {
	unreachable := func(err error) error { return fmt.Errorf("%w: Cluster %s: %w", ErrUnreachable, key, err) }
	c, err := r.cc.GetClient(ctx, key)
	if err != nil {
		return nil, unreachable(err)
	}
	rd, err := r.cc.GetUncachedClient(ctx, key)
	if err != nil {
		return nil, unreachable(err)
	}
	cfg, err := r.cc.GetRESTConfig(ctx, key)
	if err != nil {
		return nil, unreachable(err)
	}
	policy, err := r.policy(key, cfg)
	if err != nil {
		return nil, err
	}
	return &Cluster{Client: c, Reader: rd, Policy: policy, Recorder: r.recorder(key)}, nil
}

// policy returns the eviction client of the current connection (a new
// connection brings a new REST config, e.g. after the kubeconfig rotated).
func (r *Remote) policy(key client.ObjectKey, cfg *rest.Config) (rest.Interface, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.policies[key]; ok && e.cfg == cfg {
		return e.policy, nil
	}
	p, err := evictionClient(cfg)
	if err != nil {
		return nil, err
	}
	r.policies[key] = policyEntry{cfg: cfg, policy: p}
	return p, nil
}

// recorder returns the Event recorder of key's workload cluster. Its
// broadcaster lives as long as the operator and writes through whatever
// connection is current.
func (r *Remote) recorder(key client.ObjectKey) record.EventRecorder {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rec, ok := r.recorders[key]; ok {
		return rec.recorder
	}
	b := record.NewBroadcaster(record.WithContext(r.ctx))
	b.StartRecordingToSink(&eventSink{cc: r.cc, key: key})
	rec := &remoteRecorder{broadcaster: b,
		recorder: b.NewRecorder(r.mgr.GetScheme(), corev1.EventSource{Component: "nstance-operator"})}
	r.recorders[key] = rec
	return rec.recorder
}

// Watch registers a watch; it starts with the next connection of key's
// workload cluster (and every later one).
func (r *Remote) Watch(key client.ObjectKey, ctl controller.Controller, name string, kind client.Object, h handler.EventHandler, preds ...predicate.Predicate) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.watches[key] = append(r.watches[key], clustercache.NewWatcher(clustercache.WatcherOptions{
		Name: name, Watcher: ctl, Kind: kind, EventHandler: h, Predicates: preds,
	}))
	return nil
}

func (r *Remote) rewatch(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	r.mu.Lock()
	ws := append([]clustercache.Watcher(nil), r.watches[req.NamespacedName]...)
	r.mu.Unlock()
	for _, w := range ws {
		if err := r.cc.Watch(ctx, req.NamespacedName, w); err != nil {
			if errors.Is(err, clustercache.ErrClusterNotConnected) {
				// Disconnected: the next connection is announced again.
				return reconcile.Result{}, nil
			}
			return reconcile.Result{}, fmt.Errorf("watch %s in the workload cluster of %s: %w", w.Name(), req.NamespacedName, err)
		}
	}
	return reconcile.Result{}, nil
}

// eventSink writes core/v1 Events through the current connection to a
// workload cluster; the broadcaster retries what fails.
type eventSink struct {
	cc  clustercache.ClusterCache
	key client.ObjectKey
}

func (s *eventSink) do(fn func(context.Context, client.Client) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := s.cc.GetUncachedClient(ctx, s.key)
	if err != nil {
		return err
	}
	return fn(ctx, c)
}

func (s *eventSink) Create(ev *corev1.Event) (*corev1.Event, error) {
	out := ev.DeepCopy()
	return out, s.do(func(ctx context.Context, c client.Client) error { return c.Create(ctx, out) })
}

func (s *eventSink) Update(ev *corev1.Event) (*corev1.Event, error) {
	out := ev.DeepCopy()
	return out, s.do(func(ctx context.Context, c client.Client) error { return c.Update(ctx, out) })
}

func (s *eventSink) Patch(ev *corev1.Event, data []byte) (*corev1.Event, error) {
	out := ev.DeepCopy()
	return out, s.do(func(ctx context.Context, c client.Client) error {
		return c.Patch(ctx, out, client.RawPatch(types.StrategicMergePatchType, data))
	})
}
