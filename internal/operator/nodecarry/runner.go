package nodecarry

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/paused"
	"github.com/nstance-dev/nstance/internal/operator/shardconn"
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
type Shards = shardconn.Clients

// Streams follows one stream of a shard until ctx ends, reopening it
// (shardconn.Manager.Follow).
type Streams interface {
	Follow(ctx context.Context, shard, stream string, maxBackoff time.Duration, log logr.Logger, onReopen func(), follow func(context.Context) error)
}

// StreamName names the runner's instance stream in logs.
const StreamName = "instances-carry"

// Runner applies Decide to every pool every Interval, and at once after a
// replaced member was seen going on a shard's instance stream.
type Runner struct {
	Shards Shards
	// Streams, when set, opens one WatchInstances stream per shard: a
	// replaced member's Node is read as soon as its deletion is announced,
	// so an instance that is gone before the next pass (a Node with nothing
	// to drain) is carried too. Nil: passes only.
	Streams  Streams
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

	mu       sync.Mutex
	departed map[string]Entry // "{shard}/{instance}" -> seen on the stream, by group
	groupOf  map[string]string
	wake     chan struct{}
}

// NeedLeaderElection is true: only the leader writes.
func (r *Runner) NeedLeaderElection() bool { return true }

// Enabled is false when the policy carries nothing.
func (r *Runner) Enabled() bool {
	return len(r.Policy.LabelPrefixes) > 0 || len(r.Policy.TaintPrefixes) > 0
}

func (r *Runner) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Runner) init() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.wake == nil {
		r.wake = make(chan struct{}, 1)
		r.departed, r.groupOf = map[string]Entry{}, map[string]string{}
	}
}

// Start runs passes until ctx ends (manager.Runnable): every Interval, and
// right after the stream saw a replaced member go.
func (r *Runner) Start(ctx context.Context) error {
	if !r.Enabled() {
		return nil
	}
	r.init()
	r.Watch(ctx)
	t := time.NewTicker(cmp.Or(r.Interval, 5*time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-r.wake:
		}
		if err := r.Pass(ctx); err != nil && ctx.Err() == nil {
			r.Log.Error(err, "label carry pass")
		}
	}
}

// Watch opens the instance streams (when Streams is set); they stop with
// ctx.
func (r *Runner) Watch(ctx context.Context) {
	r.init()
	if r.Streams == nil {
		return
	}
	for _, shard := range r.Shards.ShardIDs() {
		go r.Streams.Follow(ctx, shard, StreamName, 0, r.Log, nil, func(ctx context.Context) error { return r.watchOnce(ctx, shard) })
	}
}

func (r *Runner) watchOnce(ctx context.Context, shard string) error {
	cl, err := r.Shards.Client(shard)
	if err != nil {
		return err
	}
	stream, err := cl.WatchInstances(ctx, &nstancev1.WatchInstancesRequest{})
	if err != nil {
		return fmt.Errorf("open WatchInstances on shard %s: %w", shard, err)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("receive instance event on shard %s: %w", shard, err)
		}
		if err := r.Observe(ctx, shard, ev); err != nil && ctx.Err() == nil {
			r.Log.Error(err, "label carry: read a departing Node", "shard", shard, "instance", ev.GetInstanceId())
		}
	}
}

// Observe records a replaced group member's carried labels and taints as
// soon as its deletion is announced (pending deletion or deleting), while
// its Node still has them; the next pass, started at once, stores them on
// the pool.
func (r *Runner) Observe(ctx context.Context, shard string, ev *nstancev1.InstanceEvent) error {
	switch ev.GetStatus() {
	case nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION, nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETING:
	default:
		return nil
	}
	if !ev.GetReplaced() || ev.GetGroupId() == "" || ev.GetProviderId() == "" {
		return nil
	}
	r.init()
	shard = cmp.Or(ev.GetShard(), shard)
	key := shard + "/" + ev.GetInstanceId()
	r.mu.Lock()
	_, seen := r.departed[key]
	r.mu.Unlock()
	if seen {
		return nil
	}
	wl, err := r.Workload.Cluster(ctx, r.Cluster)
	if err != nil {
		return err
	}
	// Listed and filtered here rather than through the cache's
	// providerID index, so that any client does (deletions are rare).
	var nodes corev1.NodeList
	if err := wl.Client.List(ctx, &nodes); err != nil {
		return fmt.Errorf("list workload Nodes for providerID %s: %w", ev.GetProviderId(), err)
	}
	i := slices.IndexFunc(nodes.Items, func(n corev1.Node) bool { return n.Spec.ProviderID == ev.GetProviderId() })
	if i < 0 {
		return nil
	}
	n := &nodes.Items[i]
	labels, taints := Carried(r.Policy, &Node{Name: n.Name, Labels: n.Labels, Taints: n.Spec.Taints})
	if len(labels) == 0 && len(taints) == 0 {
		return nil
	}
	e := Entry{Shard: shard, Instance: ev.GetInstanceId(), Node: n.Name, Departed: r.now(), Labels: labels, Taints: taints}
	// The instance's age bounds its successors; the record may be gone
	// already, and then any member in the window qualifies.
	if cl, err := r.Shards.Client(shard); err == nil {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := cl.GetInstanceStatus(lctx, &nstancev1.GetInstanceStatusRequest{
			Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: ev.GetInstanceId()}})
		cancel()
		if err == nil {
			e.Created = resp.GetInstance().GetCreatedAt().AsTime()
		}
	}
	r.mu.Lock()
	r.departed[key], r.groupOf[key] = e, ev.GetGroupId()
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
	return nil
}

// Departures is how many departures seen on the stream wait for a pass.
func (r *Runner) Departures() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.departed)
}

// prune drops the stream's entries of groups no pool holds, and any older
// than the TTL.
func (r *Runner) prune(pooled map[string]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, e := range r.departed {
		if !pooled[r.groupOf[k]] || (r.Policy.TTL > 0 && r.now().Sub(e.Departed) > r.Policy.TTL) {
			delete(r.departed, k)
			delete(r.groupOf, k)
		}
	}
}

// takeDeparted returns the stream's entries of group.
func (r *Runner) takeDeparted(group string) []Entry {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Entry
	for k, e := range r.departed {
		if r.groupOf[k] == group {
			out = append(out, e)
		}
	}
	sortEntries(out)
	return out
}

// forget drops the stream's entries a stored state now holds (or that a
// successor already carries).
func (r *Runner) forget(entries []Entry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range entries {
		delete(r.departed, e.Key())
		delete(r.groupOf, e.Key())
	}
}

// Pass makes one pass over every pool.
func (r *Runner) Pass(ctx context.Context) error {
	r.init()
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
		r.prune(nil)
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
	pooled := map[string]bool{}
	defer func() { r.prune(pooled) }()
	for i := range pools.Items {
		p := &pools.Items[i]
		if !p.DeletionTimestamp.IsZero() || p.Spec.Group == "" {
			continue
		}
		pooled[p.Spec.Group] = true
		if err := r.pool(ctx, wl, p, byGroup[p.Spec.Group], nodes, unanswered, r.now()); err != nil {
			errs = append(errs, fmt.Errorf("pool %s/%s: %w", p.Namespace, p.Name, err))
		}
	}
	return errors.Join(errs...)
}

func (r *Runner) list(ctx context.Context, shard string) ([]*nstancev1.InstanceStatus, error) {
	return shardconn.ListInstances(ctx, r.Shards, shard)
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
	departed := r.takeDeparted(p.Spec.Group)
	in := Input{Now: now, Policy: r.Policy, State: st, Unanswered: unanswered, Departed: departed}
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
	} else {
		// Stored (or carried, or dropped): the stream's copies are done.
		r.forget(departed)
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
