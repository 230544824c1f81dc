package nodecarry

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/paused"
	"github.com/nstance-dev/nstance/internal/operator/workload"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// RBAC of the runner: it reads pools and patches their annotation, and
// patches workload Nodes (granted with the manager's).
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachinepools,verbs=get;list;watch;patch

// ReasonCarried is the Normal Event on a successor Node.
const ReasonCarried = "LabelsCarried"

// Shards reaches the shards' Operator API (shardconn.Manager).
type Shards interface {
	ShardIDs() []string
	Client(shard string) (nstancev1.OperatorServiceClient, error)
}

// Runner applies Decide to every pool every Interval.
type Runner struct {
	Shards   Shards
	Workload workload.Access
	// Cluster is the Cluster API Cluster; a paused one stops every pass.
	Cluster client.ObjectKey
	// Client reads NstanceMachinePools in Namespace ("" = all) and patches
	// their annotation.
	Client    client.Client
	Namespace string
	Policy    Policy
	// Interval between passes; zero means 5s.
	Interval time.Duration
	Log      logr.Logger
	// Now defaults to time.Now.
	Now func() time.Time
}

// NeedLeaderElection is true: only the leader writes.
func (r *Runner) NeedLeaderElection() bool { return true }

// Enabled is false when the policy carries nothing.
func (r *Runner) Enabled() bool {
	return len(r.Policy.LabelPrefixes) > 0 || len(r.Policy.TaintPrefixes) > 0
}

// Start runs passes until ctx ends (manager.Runnable).
func (r *Runner) Start(ctx context.Context) error {
	if !r.Enabled() {
		return nil
	}
	_ = wait.PollUntilContextCancel(ctx, cmp.Or(r.Interval, 5*time.Second), false, func(ctx context.Context) (bool, error) {
		if err := r.Pass(ctx); err != nil && ctx.Err() == nil {
			r.Log.Error(err, "label carry pass")
		}
		return false, nil
	})
	return nil
}

// Pass makes one pass over every pool.
func (r *Runner) Pass(ctx context.Context) error {
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	cl, err := paused.ClusterNamed(ctx, r.Client, r.Cluster.Namespace, r.Cluster.Name)
	if err != nil {
		return err
	}
	if paused.IsClusterPaused(cl) {
		return nil
	}
	wl, err := r.Workload.Cluster(ctx, r.Cluster)
	if err != nil {
		r.Log.V(1).Info("workload cluster unreachable; label carry waits", "error", err.Error())
		return nil
	}
	var pools infrav1.NstanceMachinePoolList
	if err := r.Client.List(ctx, &pools, client.InNamespace(r.Namespace)); err != nil {
		return fmt.Errorf("list NstanceMachinePools: %w", err)
	}
	if len(pools.Items) == 0 {
		return nil
	}
	// Nodes first: an instance exists before its Node, so a Node seen here
	// belongs to an instance listed afterwards.
	var nodeList corev1.NodeList
	if err := wl.Client.List(ctx, &nodeList); err != nil {
		return fmt.Errorf("list workload Nodes: %w", err)
	}
	nodes := map[string]*corev1.Node{}
	for i := range nodeList.Items {
		if id := nodeList.Items[i].Spec.ProviderID; id != "" {
			nodes[id] = &nodeList.Items[i]
		}
	}
	unanswered := map[string]bool{}
	byGroup := map[string][]*nstancev1.InstanceStatus{}
	for _, shard := range r.Shards.ShardIDs() {
		insts, err := r.list(ctx, shard)
		if err != nil {
			unanswered[shard] = true
			r.Log.V(1).Info("shard did not list its instances; its entries wait", "shard", shard, "error", err.Error())
			continue
		}
		for _, s := range insts {
			if s.GetGroupId() != "" && s.GetClientToken() == "" {
				byGroup[s.GetGroupId()] = append(byGroup[s.GetGroupId()], s)
			}
		}
	}
	var errs []error
	for i := range pools.Items {
		p := &pools.Items[i]
		if !p.DeletionTimestamp.IsZero() || p.Spec.Group == "" {
			continue
		}
		if err := r.pool(ctx, wl, p, byGroup[p.Spec.Group], nodes, unanswered, now()); err != nil {
			errs = append(errs, fmt.Errorf("pool %s/%s: %w", p.Namespace, p.Name, err))
		}
	}
	return errors.Join(errs...)
}

func (r *Runner) list(ctx context.Context, shard string) ([]*nstancev1.InstanceStatus, error) {
	cl, err := r.Shards.Client(shard)
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cl.ListInstances(lctx, &nstancev1.ListInstancesRequest{})
	if err != nil {
		return nil, fmt.Errorf("ListInstances on shard %s: %w", shard, err)
	}
	return resp.GetInstances(), nil
}

// pool decides for one pool, patches the successor Nodes, then stores the
// state (only when it changed). An entry whose Node patch failed stays.
func (r *Runner) pool(ctx context.Context, wl *workload.Cluster, p *infrav1.NstanceMachinePool, insts []*nstancev1.InstanceStatus,
	nodes map[string]*corev1.Node, unanswered map[string]bool, now time.Time) error {
	log := r.Log.WithValues("pool", client.ObjectKeyFromObject(p))
	var st State
	if raw := p.Annotations[StateAnnotation]; raw != "" {
		if err := json.Unmarshal([]byte(raw), &st); err != nil {
			// Ours, but damaged: start again rather than stop carrying.
			log.Error(err, "unreadable annotation; starting with no entries", "annotation", StateAnnotation)
			st = State{}
		}
	}
	in := Input{Now: now, Policy: r.Policy, State: st, Unanswered: unanswered}
	nodeByName := map[string]*corev1.Node{}
	for _, s := range insts {
		m := Member{Shard: s.GetShard(), ID: s.GetInstanceId(), Created: s.GetCreatedAt().AsTime(), Replaced: s.GetReplaced()}
		switch s.GetState() {
		case nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION, nstancev1.InstanceState_INSTANCE_STATE_DELETING,
			nstancev1.InstanceState_INSTANCE_STATE_DELETED:
			m.Departing = true
		case nstancev1.InstanceState_INSTANCE_STATE_FAILED:
			continue
		}
		if n := nodes[s.GetProviderId()]; n != nil && s.GetProviderId() != "" {
			nodeByName[n.Name] = n
			m.Node = &Node{Name: n.Name, Labels: n.Labels, Taints: n.Spec.Taints, CarriedFrom: n.Annotations[CarriedFromAnnotation]}
		}
		in.Members = append(in.Members, m)
	}
	d := Decide(in)
	for _, dr := range d.Drop {
		log.V(1).Info("carry entry dropped", "from", dr.Entry.Key(), "successor", dr.Entry.To, "reason", dr.Reason)
	}
	var errs []error
	for _, a := range d.Apply {
		if err := r.give(ctx, wl, nodeByName[a.Node], a); err != nil {
			errs = append(errs, err)
			d.State.Entries = append(d.State.Entries, a.Entry)
			continue
		}
		log.Info("carried labels and taints to the successor's Node", "from", a.Entry.Key(), "fromNode", a.Entry.Node,
			"node", a.Node, "labels", slices.Sorted(maps.Keys(a.Labels)), "taints", len(a.Taints), "kept", a.Conflicts)
	}
	sortEntries(d.State.Entries)
	if err := r.store(ctx, p, st, d.State); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// give patches one Node: the missing labels and taints and the
// carried-from annotation, under optimistic locking (taints are a list).
func (r *Runner) give(ctx context.Context, wl *workload.Cluster, n *corev1.Node, a Apply) error {
	if n == nil {
		return fmt.Errorf("node %s not in this pass's list", a.Node)
	}
	orig := n.DeepCopy()
	n = n.DeepCopy()
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	maps.Copy(n.Labels, a.Labels)
	n.Spec.Taints = append(n.Spec.Taints, a.Taints...)
	if n.Annotations == nil {
		n.Annotations = map[string]string{}
	}
	n.Annotations[CarriedFromAnnotation] = a.Entry.Key()
	if err := wl.Client.Patch(ctx, n, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("carry labels and taints of %s to Node %s: %w", a.Entry.Key(), a.Node, err)
	}
	if wl.Recorder != nil {
		msg := fmt.Sprintf("received %d labels and %d taints of Node %s (instance %s), which it replaces", len(a.Labels), len(a.Taints), a.Entry.Node, a.Entry.Key())
		if len(a.Conflicts) > 0 {
			msg += fmt.Sprintf("; kept its own value of %v", a.Conflicts)
		}
		wl.Recorder.Event(n, corev1.EventTypeNormal, ReasonCarried, msg)
	}
	return nil
}

// store writes the state annotation when it changed (removed when empty).
func (r *Runner) store(ctx context.Context, p *infrav1.NstanceMachinePool, before, after State) error {
	if equalState(before, after) {
		return nil
	}
	orig := p.DeepCopy()
	p = p.DeepCopy()
	if len(after.Entries) == 0 {
		delete(p.Annotations, StateAnnotation)
	} else {
		raw, err := json.Marshal(after)
		if err != nil {
			return fmt.Errorf("encode %s: %w", StateAnnotation, err)
		}
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[StateAnnotation] = string(raw)
	}
	if err := r.Client.Patch(ctx, p, client.MergeFrom(orig)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("store %s: %w", StateAnnotation, err)
	}
	return nil
}

func equalState(a, b State) bool {
	ra, _ := json.Marshal(a)
	rb, _ := json.Marshal(b)
	return string(ra) == string(rb)
}
