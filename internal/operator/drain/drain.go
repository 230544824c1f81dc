package drain

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/patch"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/metrics"
	"github.com/nstance-dev/nstance/internal/operator/paused"
	"github.com/nstance-dev/nstance/internal/operator/shardconn"
	"github.com/nstance-dev/nstance/internal/operator/workload"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

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
	ReasonInstanceDeleted  = "InstanceDeleted"
	// ReasonWorkloadUnreachable: the drain waits for the workload cluster
	// (on the Cluster and the NstanceMachine).
	ReasonWorkloadUnreachable = "WorkloadClusterUnreachable"
)

// ConditionDrained is set on the NstanceMachine of an instance being drained.
const ConditionDrained = "Drained"

// Key names one instance: Namespace is the shard, Name the instance ID.
type Key = reconcile.Request

type drainState struct {
	providerID string
	group      string
	reason     nstancev1.DeletionReason
	deadline   time.Time
	// announced is when the pending deletion was first seen.
	announced time.Time
	started   bool
	acked     bool
	deleted   bool
	blocked   string
	// unreachable is the last workload-cluster error reported.
	unreachable string
}

// Coordinator drains Nodes for instances pending deletion. It is a
// controller keyed by {shard}/{instanceID}: stream loops record what each
// shard announced and enqueue the instance; Reconcile makes one
// non-blocking pass (cordon, evict what can be evicted) and requeues while
// pods remain.
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
	Cluster   client.ObjectKey
	Recorder  events.EventRecorder
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
	// ClusterName is the Cluster (in Namespace) whose pause stops drains
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

// Observe records one instance event and enqueues the instance. It blocks
// while the queue is full rather than dropping the event.
func (c *Coordinator) Observe(ctx context.Context, shard string, ev *nstancev1.InstanceEvent) {
	key := Key{NamespacedName: types.NamespacedName{Namespace: cmp.Or(ev.GetShard(), shard), Name: ev.GetInstanceId()}}
	if key.Name == "" {
		return
	}
	c.mu.Lock()
	st := c.drains[key]
	switch ev.GetStatus() {
	case nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION:
		if st == nil || st.deleted {
			st = &drainState{announced: time.Now()}
			c.drains[key] = st
		}
		st.providerID, st.group, st.reason = ev.GetProviderId(), ev.GetGroupId(), ev.GetReason()
		if d := ev.GetDrainDeadline(); d != nil {
			st.deadline = d.AsTime()
		}
	case nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETING:
		// The server no longer waits for us; a drain in progress stops.
		if st != nil {
			st.acked = true
		}
		c.mu.Unlock()
		return
	case nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETED:
		if st == nil {
			st = &drainState{}
			c.drains[key] = st
		}
		st.deleted, st.providerID = true, cmp.Or(ev.GetProviderId(), st.providerID)
	default:
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	select {
	case c.queue <- event.TypedGenericEvent[Key]{Object: key}:
	case <-ctx.Done():
	}
}

func (c *Coordinator) state(key Key) (drainState, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, ok := c.drains[key]
	if !ok {
		return drainState{}, false
	}
	return *st, true
}

func (c *Coordinator) update(key Key, fn func(*drainState)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.drains[key]; ok {
		fn(st)
	}
}

func (c *Coordinator) forget(key Key) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.drains, key)
}

// Pending returns the number of instances the coordinator is tracking.
func (c *Coordinator) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.drains)
}

// Reconcile makes one pass over one instance's drain.
func (c *Coordinator) Reconcile(ctx context.Context, key Key) (reconcile.Result, error) {
	st, ok := c.state(key)
	if !ok {
		return reconcile.Result{}, nil
	}
	shard, id := key.Namespace, key.Name
	log := c.Log.WithValues("shard", shard, "instance", id)
	machine, err := c.machineFor(ctx, shard, id)
	if err != nil {
		return reconcile.Result{}, err
	}
	// A paused cluster (clusterctl move) is not written to: no cordon,
	// eviction, acknowledgement or cleanup until it resumes. The server
	// still deletes the instance at its drain deadline.
	if p, err := c.paused(ctx, machine); err != nil {
		return reconcile.Result{}, err
	} else if p {
		log.V(1).Info("cluster paused; drain waits")
		return reconcile.Result{RequeueAfter: cmp.Or(c.RetryInterval, 2*time.Second)}, nil
	}
	if st.deleted {
		if err := c.cleanup(ctx, shard, id); err != nil {
			return reconcile.Result{}, err
		}
		c.forget(key)
		return reconcile.Result{}, nil
	}
	if st.acked {
		return reconcile.Result{}, nil
	}
	cl, err := c.Conns.Client(shard)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("shard %s: %w", shard, err)
	}
	resp, err := cl.GetInstanceStatus(ctx, &nstancev1.GetInstanceStatusRequest{Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: id}})
	if status.Code(err) == codes.NotFound {
		c.update(key, func(s *drainState) { s.deleted = true })
		return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
	}
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("get status of instance %s on shard %s: %w", id, shard, err)
	}
	inst := resp.GetInstance()
	if d := inst.GetDrainDeadline(); d != nil {
		st.deadline = d.AsTime()
	}
	switch inst.GetState() {
	case nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION:
	case nstancev1.InstanceState_INSTANCE_STATE_DELETING, nstancev1.InstanceState_INSTANCE_STATE_DELETED:
		// Already on its way out: nothing left to acknowledge.
		c.update(key, func(s *drainState) { s.acked = true })
		return reconcile.Result{}, nil
	default:
		// Not pending deletion (any more): nothing to do until announced again.
		log.V(1).Info("instance is not pending deletion", "state", inst.GetState().String())
		c.forget(key)
		return reconcile.Result{}, nil
	}
	wl, err := c.Workload.Cluster(ctx, c.Cluster)
	if err != nil {
		if vmGone(inst) {
			// Nothing left to drain whatever the Nodes say.
			return c.acknowledge(ctx, key, st, nil, nil, machine, true, "VM is already stopped or gone; drain skipped: "+inst.GetMessage())
		}
		// Never acknowledged for want of the workload cluster: the Node may
		// well be there with pods on it. Wait, and say so.
		return c.waitForWorkload(ctx, key, st, machine, err), nil
	}
	if st.unreachable != "" {
		c.update(key, func(s *drainState) { s.unreachable = "" })
	}
	node, err := c.nodeFor(ctx, wl, st.providerID)
	if err != nil {
		return reconcile.Result{}, err
	}
	if vmGone(inst) {
		return c.acknowledge(ctx, key, st, wl, node, machine, true, "VM is already stopped or gone; drain skipped: "+inst.GetMessage())
	}
	if node == nil {
		return c.acknowledge(ctx, key, st, wl, nil, machine, true, fmt.Sprintf("no Node has providerID %q; nothing to drain", st.providerID))
	}
	if !st.deadline.IsZero() && !time.Now().Before(st.deadline) {
		c.emit(wl, node, machine, corev1.EventTypeWarning, ReasonDeadlineExceeded, "drain deadline %s passed with pods still on the node; the server deletes the instance anyway", st.deadline.Format(time.RFC3339))
		return c.acknowledge(ctx, key, st, wl, node, machine, false, "")
	}
	if !st.started {
		c.emit(wl, node, machine, corev1.EventTypeNormal, ReasonDrainStarted, "draining for instance %s on shard %s (%s), deadline %s",
			id, shard, st.reason.String(), st.deadline.Format(time.RFC3339))
		c.update(key, func(s *drainState) { s.started = true })
	}
	if !node.Spec.Unschedulable {
		patch := client.MergeFrom(node.DeepCopy())
		node.Spec.Unschedulable = true
		if err := wl.Client.Patch(ctx, node, patch); err != nil {
			return reconcile.Result{}, fmt.Errorf("cordon Node %s: %w", node.Name, err)
		}
	}
	remaining, blocked, err := c.evictPass(ctx, wl, node)
	if err != nil {
		c.emit(wl, node, machine, corev1.EventTypeWarning, ReasonEvictionFailed, "%v", err)
	}
	if remaining == 0 {
		return c.acknowledge(ctx, key, st, wl, node, machine, false, "")
	}
	note := fmt.Sprintf("%d pods left", remaining)
	if len(blocked) > 0 {
		note = fmt.Sprintf("%d pods left; eviction refused by a PodDisruptionBudget for %s", remaining, strings.Join(blocked, ", "))
		if note != st.blocked {
			c.emit(wl, node, machine, corev1.EventTypeWarning, ReasonEvictionBlocked, "%s", note)
		}
	}
	c.update(key, func(s *drainState) { s.blocked = note })
	c.setCondition(ctx, machine, metav1.ConditionFalse, "Draining", note)
	return reconcile.Result{RequeueAfter: c.retryAfter(st)}, nil
}

// retryAfter is the pause before the next pass of a drain: the retry
// interval, shortened to reach the deadline.
func (c *Coordinator) retryAfter(st drainState) time.Duration {
	wait := cmp.Or(c.RetryInterval, 2*time.Second)
	if !st.deadline.IsZero() {
		wait = max(min(wait, time.Until(st.deadline)), time.Millisecond)
	}
	return wait
}

// waitForWorkload reports (once per distinct error) that a drain waits for
// its workload cluster, as a Warning Event on the Cluster and the
// NstanceMachine and the NstanceMachine's Drained condition, and retries.
// At the deadline the server deletes the instance without the
// acknowledgement; the coordinator never gives it for a cluster it cannot
// see.
func (c *Coordinator) waitForWorkload(ctx context.Context, key Key, st drainState, machine *infrav1.NstanceMachine, err error) reconcile.Result {
	note := fmt.Sprintf("drain of instance %s on shard %s waits for the workload cluster: %v", key.Name, key.Namespace, err)
	if note != st.unreachable {
		c.Log.Error(err, "drain waits for the workload cluster", "shard", key.Namespace, "instance", key.Name)
		if c.Recorder != nil {
			cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: c.Cluster.Namespace, Name: c.Cluster.Name}}
			c.Recorder.Eventf(cluster, nil, corev1.EventTypeWarning, ReasonWorkloadUnreachable, "Drain", "%s", note)
		}
		c.emit(nil, nil, machine, corev1.EventTypeWarning, ReasonWorkloadUnreachable, "%s", note)
		c.update(key, func(s *drainState) { s.unreachable = note })
	}
	c.setCondition(ctx, machine, metav1.ConditionFalse, ReasonWorkloadUnreachable, note)
	return reconcile.Result{RequeueAfter: c.retryAfter(st)}
}

// paused reports whether the instance's cluster is paused: through its
// NstanceMachine (its paused annotation or its Cluster), or for an instance
// without one (a pool's) through the operator's own Cluster.
func (c *Coordinator) paused(ctx context.Context, machine *infrav1.NstanceMachine) (bool, error) {
	if machine != nil && (machine.Labels[clusterv1.ClusterNameLabel] != "" || annotations.HasPaused(machine)) {
		return paused.Check(ctx, c.Client, machine.Namespace, machine)
	}
	if c.ClusterName == "" {
		return false, nil
	}
	cl, err := paused.ClusterNamed(ctx, c.Client, c.Namespace, c.ClusterName)
	return paused.IsClusterPaused(cl), err
}

// vmGone reports whether the provider already said the VM is stopped, failed
// or deleted, so there is no point in draining its node.
func vmGone(inst *nstancev1.InstanceStatus) bool {
	switch inst.GetState() {
	case nstancev1.InstanceState_INSTANCE_STATE_STOPPED, nstancev1.InstanceState_INSTANCE_STATE_DELETED:
		return true
	}
	return inst.GetWorkloadGone()
}

// podFilter decides which pods a drain leaves alone, as `kubectl drain
// --ignore-daemonsets --force` does: mirror pods (the kubelet owns them),
// pods that already finished, and pods controlled by a DaemonSet that
// exists (its controller would put them back). A pod whose DaemonSet is
// gone is evicted like any other unmanaged pod; a DaemonSet that cannot be
// looked up fails the pass (retried), as kubectl refuses to go on. Each
// DaemonSet is looked up once per filter.
type podFilter struct {
	reader client.Reader
	exists map[types.NamespacedName]bool
}

func newPodFilter(r client.Reader) *podFilter {
	return &podFilter{reader: r, exists: map[types.NamespacedName]bool{}}
}

// skip reports whether the drain leaves p alone.
func (f *podFilter) skip(ctx context.Context, p *corev1.Pod) (bool, error) {
	if _, ok := p.Annotations[corev1.MirrorPodAnnotationKey]; ok {
		return true, nil
	}
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return true, nil
	}
	ref := metav1.GetControllerOf(p)
	if ref == nil || ref.Kind != "DaemonSet" {
		return false, nil
	}
	key := types.NamespacedName{Namespace: p.Namespace, Name: ref.Name}
	exists, ok := f.exists[key]
	if !ok {
		err := f.reader.Get(ctx, key, &appsv1.DaemonSet{})
		switch {
		case err == nil:
			exists = true
		case apierrors.IsNotFound(err):
			exists = false
		default:
			return false, fmt.Errorf("look up DaemonSet %s of pod %s: %w", key, p.Name, err)
		}
		f.exists[key] = exists
	}
	return exists, nil
}

// evict posts one Eviction for p through the workload's policy client.
func (c *Coordinator) evict(ctx context.Context, wl *workload.Cluster, p *corev1.Pod) error {
	ev := &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}}
	return wl.Policy.Post().AbsPath("/api/v1").Namespace(p.Namespace).Resource("pods").Name(p.Name).
		SubResource("eviction").Body(ev).MaxRetries(0).Do(ctx).Error()
}

// evictPass evicts every evictable pod not yet terminating and returns how
// many evictable pods are still on the node and which were refused (429,
// a PodDisruptionBudget). Refused pods are retried on the next pass.
func (c *Coordinator) evictPass(ctx context.Context, wl *workload.Cluster, node *corev1.Node) (int, []string, error) {
	var pods corev1.PodList
	if err := wl.Reader.List(ctx, &pods, client.MatchingFields{"spec.nodeName": node.Name}); err != nil {
		return 0, nil, fmt.Errorf("list pods on Node %s: %w", node.Name, err)
	}
	// Evictions go out concurrently: an Eviction takes the API server far
	// longer than a DELETE (~95ms against ~3ms measured in envtest, see
	// bench/RESULTS.md), so evicting one pod after another made a node's
	// drain grow by that much per pod.
	var (
		mu        sync.Mutex
		remaining int
		blocked   []string
		errs      []error
		wg        sync.WaitGroup
	)
	sem := make(chan struct{}, cmp.Or(c.EvictionsPerNode, 8))
	filter := newPodFilter(wl.Reader)
	for i := range pods.Items {
		p := &pods.Items[i]
		skip, err := filter.skip(ctx, p)
		if err != nil {
			mu.Lock()
			errs = append(errs, err)
			remaining++
			mu.Unlock()
			continue
		}
		if skip {
			continue
		}
		mu.Lock()
		remaining++
		mu.Unlock()
		if p.DeletionTimestamp != nil {
			// Already terminating (an earlier eviction or someone else).
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := c.evict(ctx, wl, p)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				c.Metrics.Evicted(metrics.EvictionEvicted)
			case apierrors.IsNotFound(err):
				c.Metrics.Evicted(metrics.EvictionGone)
				remaining--
			case apierrors.IsTooManyRequests(err):
				c.Metrics.Evicted(metrics.EvictionBlocked)
				blocked = append(blocked, p.Namespace+"/"+p.Name)
			default:
				c.Metrics.Evicted(metrics.EvictionError)
				errs = append(errs, fmt.Errorf("evict pod %s/%s: %w", p.Namespace, p.Name, err))
			}
		})
	}
	wg.Wait()
	// Pods deleted without grace are gone already; count what is left.
	if remaining > 0 && len(blocked) == 0 && len(errs) == 0 {
		var after corev1.PodList
		if err := wl.Reader.List(ctx, &after, client.MatchingFields{"spec.nodeName": node.Name}); err != nil {
			return remaining, nil, fmt.Errorf("list pods on Node %s: %w", node.Name, err)
		}
		remaining = 0
		for i := range after.Items {
			skip, err := filter.skip(ctx, &after.Items[i])
			if err != nil {
				return remaining + 1, nil, err
			}
			if !skip {
				remaining++
			}
		}
	}
	slices.Sort(blocked)
	return remaining, blocked, errors.Join(errs...)
}

func (c *Coordinator) acknowledge(ctx context.Context, key Key, st drainState, wl *workload.Cluster, node *corev1.Node, machine *infrav1.NstanceMachine, skipped bool, why string) (reconcile.Result, error) {
	cl, err := c.Conns.Client(key.Namespace)
	if err != nil {
		return reconcile.Result{}, err
	}
	_, err = cl.AcknowledgeDrained(ctx, &nstancev1.AcknowledgeDrainedRequest{InstanceId: key.Name})
	if !ackSettled(err) {
		return reconcile.Result{}, fmt.Errorf("acknowledge drain of instance %s on shard %s: %w", key.Name, key.Namespace, err)
	}
	c.update(key, func(s *drainState) { s.acked = true })
	c.Metrics.DrainDone(key.Namespace, skipped, time.Since(st.announced))
	if skipped {
		c.emit(wl, node, machine, corev1.EventTypeNormal, ReasonDrainSkipped, "%s", why)
		c.setCondition(ctx, machine, metav1.ConditionTrue, ReasonDrainSkipped, why)
	} else {
		c.emit(wl, node, machine, corev1.EventTypeNormal, ReasonDrained, "node drained for instance %s in %s; deletion acknowledged",
			key.Name, time.Since(st.announced).Round(time.Millisecond))
		c.setCondition(ctx, machine, metav1.ConditionTrue, ReasonDrained, "node drained; deletion acknowledged")
	}
	c.Log.V(1).Info("drain acknowledged", "shard", key.Namespace, "instance", key.Name, "skipped", skipped)
	if c.OnAcknowledged != nil {
		c.OnAcknowledged(key.Namespace, key.Name, skipped)
	}
	return reconcile.Result{}, nil
}

// ackSettled reports whether the reply to AcknowledgeDrained ends the
// drain: acknowledged, or the server stopped waiting for one (the instance
// is gone, already deleting, or no longer pending deletion). Any other
// error is retried.
func ackSettled(err error) bool {
	switch status.Code(err) {
	case codes.OK, codes.NotFound, codes.Aborted, codes.FailedPrecondition:
		return true
	}
	return false
}

func (c *Coordinator) nodeFor(ctx context.Context, wl *workload.Cluster, providerID string) (*corev1.Node, error) {
	if providerID == "" {
		return nil, nil
	}
	var nodes corev1.NodeList
	if err := wl.Client.List(ctx, &nodes, client.MatchingFields{NodeProviderIDIndex: providerID}); err != nil {
		return nil, fmt.Errorf("find Node with providerID %s: %w", providerID, err)
	}
	if len(nodes.Items) == 0 {
		return nil, nil
	}
	return &nodes.Items[0], nil
}

func (c *Coordinator) machineFor(ctx context.Context, shard, id string) (*infrav1.NstanceMachine, error) {
	var list infrav1.NstanceMachineList
	if err := c.Client.List(ctx, &list, client.InNamespace(c.Namespace), client.MatchingFields{MachineInstanceIndex: shard + "/" + id}); err != nil {
		return nil, fmt.Errorf("find NstanceMachine of instance %s: %w", id, err)
	}
	if len(list.Items) == 0 {
		return nil, nil
	}
	return &list.Items[0], nil
}

// cleanup removes what stood for a deleted instance: the owning Machine
// when there is one (core Cluster API then deletes the NstanceMachine and
// the Node), otherwise the NstanceMachine itself. The Machine is first
// marked so that CAPI neither drains the Node of the gone VM again nor waits
// for its volumes to detach.
func (c *Coordinator) cleanup(ctx context.Context, shard, id string) error {
	m, err := c.machineFor(ctx, shard, id)
	if err != nil || m == nil {
		return err
	}
	if !m.DeletionTimestamp.IsZero() {
		return nil
	}
	for _, ref := range m.OwnerReferences {
		if ref.Kind != "Machine" || !strings.HasPrefix(ref.APIVersion, clusterv1.GroupVersion.Group+"/") {
			continue
		}
		machine := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: m.Namespace, Name: ref.Name}}
		ok, err := c.excludeFromCAPIDrain(ctx, client.ObjectKeyFromObject(machine), ref.UID, fmt.Sprintf("instance %s was deleted on shard %s", id, shard))
		if err != nil {
			return fmt.Errorf("mark Machine %s: %w", ref.Name, err)
		}
		if !ok {
			return nil
		}
		c.emit(nil, nil, m, corev1.EventTypeNormal, ReasonInstanceDeleted, "instance %s was deleted on shard %s; deleting Machine %s", id, shard, ref.Name)
		if err := c.Client.Delete(ctx, machine, client.Preconditions{UID: &ref.UID}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("delete Machine %s: %w", ref.Name, err)
		}
		return nil
	}
	c.emit(nil, nil, m, corev1.EventTypeNormal, ReasonInstanceDeleted, "instance %s was deleted on shard %s; deleting NstanceMachine", id, shard)
	if err := c.Client.Delete(ctx, m); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete NstanceMachine %s: %w", m.Name, err)
	}
	return nil
}

// excludeFromCAPIDrain sets core Cluster API's exclude-node-draining and
// exclude-wait-for-node-volume-detach annotations on the Machine with uid,
// whose VM is gone (drained by the coordinator before, or stopped). ok is
// false when that Machine no longer exists (another one may have taken its
// name).
func (c *Coordinator) excludeFromCAPIDrain(ctx context.Context, key client.ObjectKey, uid types.UID, why string) (bool, error) {
	// Read uncached: a Machine missing from a lagging cache must not be
	// taken for a deleted one.
	reader := c.Reader
	if reader == nil {
		reader = c.Client
	}
	var m clusterv1.Machine
	if err := reader.Get(ctx, key, &m); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, err
	}
	if m.UID != uid {
		return false, nil
	}
	_, drainExcluded := m.Annotations[clusterv1.ExcludeNodeDrainingAnnotation]
	_, detachExcluded := m.Annotations[clusterv1.ExcludeWaitForNodeVolumeDetachAnnotation]
	if drainExcluded && detachExcluded {
		return true, nil
	}
	patch := client.MergeFromWithOptions(m.DeepCopy(), client.MergeFromWithOptimisticLock{})
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[clusterv1.ExcludeNodeDrainingAnnotation] = why
	m.Annotations[clusterv1.ExcludeWaitForNodeVolumeDetachAnnotation] = why
	if err := c.Client.Patch(ctx, &m, patch); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

// emit records an Event about the Node (in the workload cluster wl) and the
// NstanceMachine (in the operator's cluster); either may be nil.
func (c *Coordinator) emit(wl *workload.Cluster, node *corev1.Node, machine *infrav1.NstanceMachine, typ, reason, format string, args ...any) {
	if node != nil && wl != nil && wl.Recorder != nil {
		wl.Recorder.Eventf(node, typ, reason, format, args...)
	}
	if machine != nil && c.Recorder != nil {
		c.Recorder.Eventf(machine, nil, typ, reason, "Drain", format, args...)
	}
}

func (c *Coordinator) setCondition(ctx context.Context, m *infrav1.NstanceMachine, st metav1.ConditionStatus, reason, msg string) {
	if m == nil {
		return
	}
	// The patch helper writes only a change, and only this condition.
	helper, err := patch.NewHelper(m, c.Client)
	if err != nil {
		c.Log.Error(err, "set Drained condition", "nstanceMachine", m.Name)
		return
	}
	conditions.Set(m, metav1.Condition{Type: ConditionDrained, Status: st, Reason: reason, Message: msg})
	if err := helper.Patch(ctx, m, patch.WithOwnedConditions{Conditions: []string{ConditionDrained}}); err != nil && !apierrors.IsNotFound(err) {
		c.Log.Error(err, "set Drained condition", "nstanceMachine", m.Name)
	}
}
