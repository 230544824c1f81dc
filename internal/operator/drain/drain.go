package drain

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/drain/machinecleanup"
	"github.com/nstance-dev/nstance/internal/operator/metrics"
	"github.com/nstance-dev/nstance/internal/operator/shardconn"
	"github.com/nstance-dev/nstance/internal/operator/workload"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// RBAC of the coordinator and its helpers (nodedrain cordons and evicts,
// machinecleanup marks and deletes Machines).
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=pods/eviction,verbs=create
// +kubebuilder:rbac:groups=apps,resources=daemonsets,verbs=get
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machines,verbs=get;list;watch;patch;delete
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachines,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachines/status,verbs=get;update;patch

// Index names registered by SetupIndexes.
const (
	// NodeProviderIDIndex indexes Nodes by spec.providerID (in the cache
	// of the workload cluster, see package workload).
	NodeProviderIDIndex = workload.NodeProviderIDIndex
	// MachineInstanceIndex indexes NstanceMachines by "{shard}/{instanceID}".
	MachineInstanceIndex = "spec.shardInstance"
)

// Event reasons, on the Node (and the NstanceMachine when there is one).
const (
	ReasonDrainStarted     = "DrainStarted"
	ReasonEvictionBlocked  = "EvictionBlocked"
	ReasonEvictionFailed   = "EvictionFailed"
	ReasonDrained          = "Drained"
	ReasonDrainSkipped     = "DrainSkipped"
	ReasonDeadlineExceeded = "DrainDeadlineExceeded"
	ReasonInstanceDeleted  = machinecleanup.ReasonInstanceDeleted
	// ReasonWorkloadUnreachable: the drain waits for the workload cluster
	// (on the Cluster and the NstanceMachine).
	ReasonWorkloadUnreachable = "WorkloadClusterUnreachable"
)

// ConditionDrained is set on the NstanceMachine of an instance being drained.
const ConditionDrained = "Drained"

// Key names one instance: Namespace is the shard, Name the instance ID.
type Key = reconcile.Request

// Coordinator drains Nodes for instances pending deletion. It is a
// controller keyed by {shard}/{instanceID}: stream loops record what each
// shard announced and enqueue the instance; Reconcile makes one
// non-blocking pass (the nodedrain helper cordons and evicts what can be
// evicted) and requeues while pods remain, and once an instance is deleted
// has machinecleanup remove its Machine.
type Coordinator struct {
	Conns *shardconn.Manager
	// Client reads NstanceMachines from the cache and writes Cluster API
	// and Nstance objects (the operator's own cluster).
	Client client.Client
	// Reader reads Machines before marking them, uncached.
	Reader client.Reader
	// Workload gives the cluster whose Nodes are drained: Nodes, Pods,
	// evictions (posted without client-side retry: client-go would sleep
	// on a PodDisruptionBudget refusal inside the call; the coordinator
	// retries it on its own schedule) and Events about Nodes.
	Workload workload.Access
	// Cluster is the Cluster API Cluster the shards' instances belong to.
	Cluster  client.ObjectKey
	Recorder events.EventRecorder
	// Namespace holds the NstanceMachines; empty means every namespace.
	Namespace string
	Log       logr.Logger
	// RetryInterval separates eviction passes while pods remain; zero means 2s.
	RetryInterval time.Duration
	// MaxBackoff caps the delay between stream attempts; zero means 5s.
	MaxBackoff time.Duration
	// Workers is the number of drains progressing at once; zero means 16.
	Workers int
	// EvictionsPerNode bounds the eviction requests one drain has in
	// flight at once; zero means 8.
	EvictionsPerNode int
	// OnAcknowledged, when set, is called after a drain was acknowledged
	// (tests and benchmarks measure with it).
	OnAcknowledged func(shard, instanceID string, skipped bool)
	// ClusterName is the Cluster (in Cluster.Namespace, else Namespace)
	// whose pause stops drains
	// of instances that have no NstanceMachine (those of pools).
	ClusterName string
	// Metrics records drain durations and eviction outcomes (nil: none).
	Metrics *metrics.Metrics

	mu     sync.Mutex
	drains map[Key]*drainState
	queue  chan event.TypedGenericEvent[Key]
}

// SetupIndexes registers the field indexes the coordinator (and the machine
// controller) look objects up by in the operator's cluster. Nodes are
// indexed by the workload access.
func SetupIndexes(ctx context.Context, mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &infrav1.NstanceMachine{}, MachineInstanceIndex, func(o client.Object) []string {
		m := o.(*infrav1.NstanceMachine)
		// spec names the instance (it survives clusterctl move); status
		// covers NstanceMachines that name it elsewhere (a pool's).
		id, shard := cmp.Or(m.Spec.InstanceID, m.Status.InstanceID), cmp.Or(m.Spec.Shard, m.Status.Shard)
		if id == "" || shard == "" {
			return nil
		}
		return []string{shard + "/" + id}
	}); err != nil {
		return fmt.Errorf("index NstanceMachines by instance: %w", err)
	}
	return nil
}

// SetupWithManager registers the drain controller. Call Start (from a
// leader-only runnable, once the shard connections exist) to open the
// streams.
func (c *Coordinator) SetupWithManager(mgr ctrl.Manager) error {
	c.drains = map[Key]*drainState{}
	c.queue = make(chan event.TypedGenericEvent[Key], 1024)
	src := source.TypedChannel[Key, Key](c.queue, handler.TypedFuncs[Key, Key]{
		GenericFunc: func(_ context.Context, e event.TypedGenericEvent[Key], q workqueue.TypedRateLimitingInterface[Key]) {
			q.Add(e.Object)
		},
	})
	return ctrl.NewControllerManagedBy(mgr).Named("drain").
		WatchesRawSource(src).
		WithOptions(controller.Options{MaxConcurrentReconciles: cmp.Or(c.Workers, 16)}).
		Complete(c)
}

// Start opens one WatchInstances stream per shard; they stop with ctx.
func (c *Coordinator) Start(ctx context.Context) {
	for _, shard := range c.Conns.ShardIDs() {
		go c.loop(ctx, shard)
	}
}

// StreamInstances names the instance stream in logs and metrics.
const StreamInstances = "instances"

// loop keeps the shard's instance stream open (streamloop), counting each
// reopening.
func (c *Coordinator) loop(ctx context.Context, shard string) {
	c.Conns.Follow(ctx, shard, StreamInstances, c.MaxBackoff, c.Log, func() {
		if c.Metrics != nil {
			c.Metrics.StreamReconnected(shard, StreamInstances)
		}
	}, func(ctx context.Context) error { return c.watchOnce(ctx, shard) })
}

// watchOnce follows one stream. On connect the server re-announces every
// drain still waiting for an acknowledgement, so nothing is lost while the
// stream was down.
func (c *Coordinator) watchOnce(ctx context.Context, shard string) error {
	cl, err := c.Conns.Client(shard)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := cl.WatchInstances(sctx, &nstancev1.WatchInstancesRequest{})
	if err != nil {
		return fmt.Errorf("open WatchInstances: %w", err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("receive instance event: %w", err)
		}
		c.Observe(ctx, shard, ev)
	}
}
