package nodejoin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/events"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/patch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/paused"
	"github.com/nstance-dev/nstance/internal/operator/shardconn"
	"github.com/nstance-dev/nstance/internal/operator/workload"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// RBAC of the runner: it reads Nodes, NstanceMachines and pools, sets
// conditions and records Events (granted with the manager's).
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachines,verbs=get;list;watch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachines/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachinepools,verbs=get;list;watch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachinepools/status,verbs=get;update;patch

// Condition, reasons and Event reasons.
const (
	// ConditionNodeJoined is set on an NstanceMachine: True once its Node
	// was Ready, False (JoinTimeout) when it missed the join deadline. On an
	// NstanceMachinePool it is False when a member without an
	// NstanceMachine missed it, True again once a later member joined.
	ConditionNodeJoined = "NodeJoined"
	// ReasonJoinTimeout is the condition reason and Warning Event reason of
	// a late instance.
	ReasonJoinTimeout = "JoinTimeout"
	// ReasonNodeReady: the Node was Ready.
	ReasonNodeReady = "NodeReady"
	// ReasonUnknownProviderID is the Warning Event on an orphan Node.
	ReasonUnknownProviderID = "UnknownProviderID"
)

// Shards reaches the shards' Operator API (shardconn.Manager).
type Shards = shardconn.Clients

// Runner applies Decide every Interval.
type Runner struct {
	Shards Shards
	// Workload gives the workload cluster of Cluster (Nodes, Events on Nodes).
	Workload workload.Access
	// Cluster is the Cluster API Cluster; a paused one stops every pass.
	Cluster client.ObjectKey
	// ClusterID is the Nstance cluster (provider-ID prefix).
	ClusterID string
	// Client reads NstanceMachines and NstanceMachinePools in Namespace
	// (cached) and writes their conditions.
	Client    client.Client
	Namespace string
	Recorder  events.EventRecorder
	// Timeout is the join timeout; zero or less disables the runner.
	Timeout time.Duration
	// Interval between passes; zero means Timeout/10 within [1s, 10s].
	Interval time.Duration
	Log      logr.Logger
	// Now defaults to time.Now.
	Now func() time.Time

	// Memory of the passes (one goroutine: Start's).
	joined   map[string]bool
	marked   map[string]bool
	reported map[types.UID]bool
}

// NeedLeaderElection is true: only the leader replaces instances.
func (r *Runner) NeedLeaderElection() bool { return true }

func (r *Runner) interval() time.Duration {
	if r.Interval > 0 {
		return r.Interval
	}
	return min(max(r.Timeout/10, time.Second), 10*time.Second)
}

// Start runs passes until ctx ends (manager.Runnable). Errors of a pass are
// logged; the next pass tries again.
func (r *Runner) Start(ctx context.Context) error {
	if r.Timeout <= 0 {
		return nil
	}
	_ = wait.PollUntilContextCancel(ctx, r.interval(), false, func(ctx context.Context) (bool, error) {
		if err := r.Pass(ctx); err != nil && ctx.Err() == nil {
			r.Log.Error(err, "join deadline pass")
		}
		return false, nil // every interval until ctx ends
	})
	return nil
}

// Pass makes one pass: read every shard's instances and the workload
// Nodes, decide, and act.
func (r *Runner) Pass(ctx context.Context) error {
	if r.joined == nil {
		r.joined, r.marked, r.reported = map[string]bool{}, map[string]bool{}, map[types.UID]bool{}
	}
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	cl, err := paused.ClusterNamed(ctx, r.Client, r.Cluster.Namespace, r.Cluster.Name)
	if err != nil {
		return err
	}
	if paused.IsClusterPaused(cl) {
		r.Log.V(1).Info("cluster paused; join deadline waits")
		return nil
	}
	wl, err := r.Workload.Cluster(ctx, r.Cluster)
	if err != nil {
		// Nothing may be concluded about Nodes of a cluster not reachable.
		r.Log.V(1).Info("workload cluster unreachable; join deadline waits", "error", err.Error())
		return nil
	}
	// Nodes first: an instance is created before its Node, so a Node seen
	// here is held by an instance listed afterwards.
	var nodeList corev1.NodeList
	if err := wl.Client.List(ctx, &nodeList); err != nil {
		return fmt.Errorf("list workload Nodes: %w", err)
	}
	nodes := make([]Node, 0, len(nodeList.Items))
	nodeObjs := map[string]*corev1.Node{}
	for i := range nodeList.Items {
		n := &nodeList.Items[i]
		nodeObjs[n.Name] = n
		nodes = append(nodes, nodeOf(n))
	}
	machines, err := r.machines(ctx)
	if err != nil {
		return err
	}
	pools, err := r.pools(ctx)
	if err != nil {
		return err
	}
	in := Input{Now: now(), Timeout: r.Timeout, ClusterID: r.ClusterID, Nodes: nodes, Unanswered: map[string]bool{}, Reported: r.reported}
	listed := map[string]bool{}
	for _, shard := range r.Shards.ShardIDs() {
		insts, err := r.list(ctx, shard)
		if err != nil {
			in.Unanswered[shard] = true
			r.Log.V(1).Info("shard did not list its instances; its instances wait", "shard", shard, "error", err.Error())
			continue
		}
		for _, s := range insts {
			i := instanceOf(shard, s)
			listed[i.Key()] = true
			m := machines[i.Key()]
			i.Joined = r.joined[i.Key()] || m != nil && conditions.IsTrue(m, ConditionNodeJoined)
			if p := pools[i.Group]; p != nil && p.Spec.JoinTimeout != nil {
				i.Timeout = p.Spec.JoinTimeout.Duration
				if i.Timeout == 0 {
					i.Timeout = -1 // off for this pool
				}
			}
			in.Instances = append(in.Instances, i)
		}
	}
	d := Decide(in)

	var errs []error
	for _, j := range d.Joined {
		r.joined[j.Key()] = true
		if err := r.markJoined(ctx, j, machines[j.Key()], pools[j.Group]); err != nil {
			errs = append(errs, err)
		}
	}
	for _, l := range d.Late {
		if err := r.replace(ctx, wl, l, machines[l.Instance.Key()], pools[l.Instance.Group], nodeObjs[l.Node]); err != nil {
			errs = append(errs, err)
		}
	}
	reported := map[types.UID]bool{}
	for _, n := range nodes {
		if r.reported[n.UID] {
			reported[n.UID] = true
		}
	}
	for _, o := range d.Orphans {
		reported[o.Node.UID] = true
		if !o.New {
			continue
		}
		msg := fmt.Sprintf("providerID %s has the prefix of Nstance cluster %s but no shard reports an instance with it", o.Node.ProviderID, r.ClusterID)
		r.Log.Info("Node with an unknown Nstance providerID", "node", o.Node.Name, "providerID", o.Node.ProviderID)
		if obj := nodeObjs[o.Node.Name]; obj != nil && wl.Recorder != nil {
			wl.Recorder.Event(obj, corev1.EventTypeWarning, ReasonUnknownProviderID, msg)
		}
	}
	r.reported = reported
	for k := range r.joined {
		if shard, _, _ := cutKey(k); !in.Unanswered[shard] && !listed[k] {
			delete(r.joined, k)
		}
	}
	for k := range r.marked {
		if shard, _, _ := cutKey(k); !in.Unanswered[shard] && !listed[k] {
			delete(r.marked, k)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("join deadline: %w", errors.Join(errs...))
	}
	return nil
}

func cutKey(k string) (shard, id string, ok bool) { return strings.Cut(k, "/") }

func (r *Runner) list(ctx context.Context, shard string) ([]*nstancev1.InstanceStatus, error) {
	return shardconn.ListInstances(ctx, r.Shards, shard)
}

func instanceOf(shard string, s *nstancev1.InstanceStatus) Instance {
	i := Instance{
		Shard: cmp.Or(s.GetShard(), shard), ID: s.GetInstanceId(), Group: s.GetGroupId(), ProviderID: s.GetProviderId(),
		OnDemand: s.GetClientToken() != "" || s.GetGroupId() == "", State: s.GetState(),
	}
	if s.GetFirstHealthAt() != nil {
		i.FirstHealthAt = s.GetFirstHealthAt().AsTime()
	}
	return i
}

func nodeOf(n *corev1.Node) Node {
	out := Node{Name: n.Name, UID: n.UID, ProviderID: n.Spec.ProviderID}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			out.Ready = c.Status == corev1.ConditionTrue
			out.ReadyChanged = c.LastTransitionTime.Time
		}
	}
	return out
}

// machines maps "{shard}/{instance}" to the NstanceMachine that stands for
// the instance: one that created it (spec.instanceID) or mirrors a pool's
// member (nstance.dev/pool-instance).
func (r *Runner) machines(ctx context.Context) (map[string]*infrav1.NstanceMachine, error) {
	var list infrav1.NstanceMachineList
	if err := r.Client.List(ctx, &list, client.InNamespace(r.Namespace)); err != nil {
		return nil, fmt.Errorf("list NstanceMachines: %w", err)
	}
	out := map[string]*infrav1.NstanceMachine{}
	for i := range list.Items {
		m := &list.Items[i]
		id := cmp.Or(m.Spec.InstanceID, m.Status.InstanceID, infrav1.PoolInstanceID(m))
		shard := cmp.Or(m.Spec.Shard, m.Status.Shard)
		if id != "" && shard != "" {
			out[shard+"/"+id] = m
		}
	}
	return out, nil
}

// markJoined records NodeJoined=True on the instance's NstanceMachine, or
// sets it True again on the pool of a member without one.
func (r *Runner) markJoined(ctx context.Context, inst Instance, m *infrav1.NstanceMachine, pool *infrav1.NstanceMachinePool) error {
	if m != nil {
		if !m.DeletionTimestamp.IsZero() {
			return nil
		}
		return r.setCondition(ctx, m, metav1.ConditionTrue, ReasonNodeReady, "Node with providerID "+inst.ProviderID+" is Ready")
	}
	if pool == nil {
		return nil
	}
	c := conditions.Get(pool, ConditionNodeJoined)
	if c == nil || c.Status != metav1.ConditionFalse || !inst.FirstHealthAt.After(c.LastTransitionTime.Time) {
		return nil
	}
	return r.setCondition(ctx, pool, metav1.ConditionTrue, ReasonNodeReady,
		fmt.Sprintf("instance %s on shard %s joined (Node with providerID %s is Ready)", inst.ID, inst.Shard, inst.ProviderID))
}

// replace marks a late instance (Warning Event, NodeJoined=False) once and
// deletes it with skip_drain: a Node that never joined has nothing to
// drain. A group member is replaced by its group; an NstanceMachine's
// instance is then gone, and the drain coordinator deletes the owning
// Machine (its MachineSet creates another), as for any server-side deletion.
func (r *Runner) replace(ctx context.Context, wl *workload.Cluster, l Late, m *infrav1.NstanceMachine, pool *infrav1.NstanceMachinePool, node *corev1.Node) error {
	inst := l.Instance
	log := r.Log.WithValues("shard", inst.Shard, "instance", inst.ID, "providerID", inst.ProviderID)
	if !r.marked[inst.Key()] {
		log.Info("instance missed its join deadline; replacing it", "deadline", l.Deadline, "reason", l.Message)
		note := fmt.Sprintf("instance %s on shard %s: %s; deleting it so that it is replaced", inst.ID, inst.Shard, l.Message)
		var err error
		switch {
		case m != nil:
			r.event(m, note)
			err = r.setCondition(ctx, m, metav1.ConditionFalse, ReasonJoinTimeout, l.Message)
		case pool != nil:
			r.event(pool, note)
			err = r.setCondition(ctx, pool, metav1.ConditionFalse, ReasonJoinTimeout, note)
		default:
			r.event(&clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: r.Cluster.Namespace, Name: r.Cluster.Name}}, note)
		}
		if node != nil && wl.Recorder != nil {
			wl.Recorder.Event(node, corev1.EventTypeWarning, ReasonJoinTimeout, note)
		}
		if err != nil {
			// Marked next pass; the instance is not deleted unmarked.
			return err
		}
		r.marked[inst.Key()] = true
	}
	cl, err := r.Shards.Client(inst.Shard)
	if err != nil {
		return err
	}
	if _, err := cl.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: inst.ID, SkipDrain: true}); err != nil && status.Code(err) != codes.NotFound {
		return fmt.Errorf("DeleteInstance %s on shard %s: %w", inst.ID, inst.Shard, err)
	}
	return nil
}

func (r *Runner) event(obj client.Object, note string) {
	if r.Recorder != nil {
		r.Recorder.Eventf(obj, nil, corev1.EventTypeWarning, ReasonJoinTimeout, "Replace", "%s", note)
	}
}

// pools maps server group IDs to the NstanceMachinePools that hold them.
func (r *Runner) pools(ctx context.Context) (map[string]*infrav1.NstanceMachinePool, error) {
	var list infrav1.NstanceMachinePoolList
	if err := r.Client.List(ctx, &list, client.InNamespace(r.Namespace)); err != nil {
		return nil, fmt.Errorf("list NstanceMachinePools: %w", err)
	}
	out := map[string]*infrav1.NstanceMachinePool{}
	for i := range list.Items {
		if g := list.Items[i].Spec.Group; g != "" {
			out[g] = &list.Items[i]
		}
	}
	return out, nil
}

type conditionObject interface {
	client.Object
	conditions.Setter
}

// setCondition writes only ConditionNodeJoined, and only a change.
func (r *Runner) setCondition(ctx context.Context, obj conditionObject, st metav1.ConditionStatus, reason, msg string) error {
	if c := conditions.Get(obj, ConditionNodeJoined); c != nil && c.Status == st && c.Reason == reason && c.Message == msg {
		return nil
	}
	helper, err := patch.NewHelper(obj, r.Client)
	if err != nil {
		return fmt.Errorf("patch helper for %s: %w", obj.GetName(), err)
	}
	conditions.Set(obj, metav1.Condition{Type: ConditionNodeJoined, Status: st, Reason: reason, Message: msg})
	if err := helper.Patch(ctx, obj, patch.WithOwnedConditions{Conditions: []string{ConditionNodeJoined}}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("set %s on %s: %w", ConditionNodeJoined, obj.GetName(), err)
	}
	return nil
}
