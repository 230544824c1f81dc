package drain

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/drain/machinecleanup"
	"github.com/nstance-dev/nstance/internal/operator/drain/nodedrain"
	"github.com/nstance-dev/nstance/internal/operator/paused"
	"github.com/nstance-dev/nstance/internal/operator/workload"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

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
		if err := c.cleaner().Remove(ctx, machine, shard, id); err != nil {
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
		if !drainAnnounced(inst) {
			// Held while the instance leaves its load balancers: the server
			// announces the drain, with its deadline, once it is out. A
			// drain now would evict pods that still get traffic.
			log.V(1).Info("drain not announced yet (held for load balancers)")
			c.forget(key)
			return reconcile.Result{}, nil
		}
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
	h := c.nodeDrain(wl)
	if err := h.Cordon(ctx, node); err != nil {
		return reconcile.Result{}, err
	}
	remaining, blocked, err := h.Pass(ctx, node.Name)
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
	cl, err := paused.ClusterNamed(ctx, c.Client, cmp.Or(c.Cluster.Namespace, c.Namespace), c.ClusterName)
	return paused.IsClusterPaused(cl), err
}

// drainAnnounced reports whether the server wants inst drained now: a
// pending deletion with a drain deadline. The server leaves the deadline
// out while it holds the drain (the instance is still being deregistered
// from its load balancers) and when it deletes without a drain.
func drainAnnounced(inst *nstancev1.InstanceStatus) bool {
	return inst.GetState() == nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION && inst.GetDrainDeadline() != nil
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

// nodeDrain returns the helper that drains Nodes of wl.
func (c *Coordinator) nodeDrain(wl *workload.Cluster) *nodedrain.Helper {
	return &nodedrain.Helper{Client: wl.Client, Reader: wl.Reader, Policy: wl.Policy, EvictionsPerNode: c.EvictionsPerNode, Metrics: c.Metrics}
}

// cleaner returns the helper that removes the objects of deleted instances.
func (c *Coordinator) cleaner() *machinecleanup.Cleaner {
	return &machinecleanup.Cleaner{Client: c.Client, Reader: c.Reader, Recorder: c.Recorder}
}
