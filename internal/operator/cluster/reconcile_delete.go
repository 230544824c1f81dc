package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/abandon"
	"github.com/nstance-dev/nstance/internal/operator/ledger"
	"github.com/nstance-dev/nstance/internal/operator/paused"
	"github.com/nstance-dev/nstance/internal/operator/shardgroup"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// reconcileDelete keeps the finalizer of a deleted NstanceCluster until no
// instance of its cluster is left on any configured shard (DecideDelete):
// it deletes the cluster's objects nothing else deletes (DeletedWithCluster),
// waits for every Nstance object of the cluster to go (each waits for its
// own instances), and asks every shard for members of the cluster's groups
// (its shard groups', and for the operator's Cluster every group of the
// ledger), surge and pending instances included. Ready false says what it
// waits for. The deferred patch writes the condition and the finalizer.
func (r *Reconciler) reconcileDelete(ctx context.Context, nc *infrav1.NstanceCluster) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(nc, infrav1.ClusterFinalizer) {
		return ctrl.Result{}, nil
	}
	name := clusterName(nc)
	objects, byShard, err := r.clusterObjects(ctx, nc.Namespace, name)
	if err != nil {
		return ctrl.Result{}, err
	}
	cl, err := paused.ClusterNamed(ctx, r.Client, nc.Namespace, name)
	if err != nil {
		return ctrl.Result{}, err
	}
	in := DeleteInput{Objects: objects, Abandon: cl != nil && abandon.Annotated(cl)}
	var all []string
	if r.Ledger != nil && (r.Cluster == client.ObjectKey{} || r.Cluster == client.ObjectKey{Namespace: nc.Namespace, Name: name}) {
		entries, err := r.Ledger.Load(ctx, cmp.Or[client.Reader](r.Reader, r.Client))
		if err != nil {
			return ctrl.Result{}, err
		}
		all = ledger.Groups(entries)
		for _, o := range ledger.Orphans(entries) {
			if r.Conns != nil && r.Conns.Known(o.Shard) {
				byShard[o.Shard] = append(byShard[o.Shard], o.Group)
			} else {
				in.Unconfigured = append(in.Unconfigured, o)
			}
		}
	}
	if r.Conns == nil {
		return ctrl.Result{}, errors.New("no shard connections: cannot tell whether the cluster's instances are gone")
	}
	for _, shard := range r.Conns.ShardIDs() {
		in.Shards = append(in.Shards, r.askShard(ctx, shard, byShard[shard], all))
	}
	d := DecideDelete(in)
	if !d.Release {
		conditions.Set(nc, metav1.Condition{Type: infrav1.ReadyCondition, Status: metav1.ConditionFalse, Reason: d.Reason, Message: d.Message})
		return ctrl.Result{RequeueAfter: cmp.Or(r.Poll, 2*time.Second)}, nil
	}
	for _, s := range d.Abandoned {
		r.event(nc, corev1.EventTypeWarning, abandon.EventReason,
			"shard %s cannot be reached (%s) and Cluster %s carries %s: its instances of groups [%s] are abandoned; "+
				"the operator deletes these groups when the shard is reachable again (see the shard groups' events for their instances)",
			s.Shard, s.Err, name, infrav1.AbandonInstancesAnnotation, strings.Join(s.Groups, ", "))
	}
	if len(in.Unconfigured) > 0 {
		var parts []string
		for _, o := range in.Unconfigured {
			parts = append(parts, o.Group+" on "+o.Shard)
		}
		r.event(nc, corev1.EventTypeWarning, EventOrphanedGroups,
			"groups left on shards no longer configured, deleted there when the shard is configured again: %s", strings.Join(parts, ", "))
	}
	r.event(nc, corev1.EventTypeNormal, EventInstancesDeleted, "no instance of cluster %s is left on the reachable shards [%s]",
		name, strings.Join(reachable(in.Shards), ", "))
	log.FromContext(ctx).Info("NstanceCluster deleted", "abandonedShards", len(d.Abandoned))
	controllerutil.RemoveFinalizer(nc, infrav1.ClusterFinalizer)
	return ctrl.Result{}, nil
}

func (r *Reconciler) event(nc *infrav1.NstanceCluster, typ, reason, format string, args ...any) {
	if r.Recorder != nil {
		r.Recorder.Eventf(nc, nil, typ, reason, "Delete", format, args...)
	}
}

func reachable(shards []ShardState) []string {
	var out []string
	for _, s := range shards {
		if s.Err == "" {
			out = append(out, s.Shard)
		}
	}
	return out
}

// clusterName is the name of the NstanceCluster's Cluster: its cluster-name
// label, else its owner Cluster, else its own name (the templates use one
// name for both).
func clusterName(nc *infrav1.NstanceCluster) string {
	if n := nc.Labels[clusterv1.ClusterNameLabel]; n != "" {
		return n
	}
	for _, ref := range nc.OwnerReferences {
		if ref.Kind == "Cluster" && strings.HasPrefix(ref.APIVersion, clusterv1.GroupVersion.Group+"/") {
			return ref.Name
		}
	}
	return nc.Name
}

// clusterObjects lists the cluster's Nstance objects (cluster-name label)
// still present, as "Kind/name", after deleting those DeletedWithCluster
// (all of them once no MachinePool or Machine of the cluster is left),
// and the groups of its shard groups by shard.
func (r *Reconciler) clusterObjects(ctx context.Context, namespace, name string) ([]string, map[string][]string, error) {
	sel := []client.ListOption{client.InNamespace(namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: name}}
	var sgs infrav1.NstanceShardGroupList
	var pools infrav1.NstanceMachinePoolList
	var machines infrav1.NstanceMachineList
	for _, l := range []client.ObjectList{&sgs, &pools, &machines} {
		if err := r.Client.List(ctx, l, sel...); err != nil {
			return nil, nil, fmt.Errorf("list the Nstance objects of Cluster %s/%s: %w", namespace, name, err)
		}
	}
	var mps clusterv1.MachinePoolList
	var ms clusterv1.MachineList
	for _, l := range []client.ObjectList{&mps, &ms} {
		if err := r.Client.List(ctx, l, sel...); err != nil {
			return nil, nil, fmt.Errorf("list the Cluster API objects of Cluster %s/%s: %w", namespace, name, err)
		}
	}
	capiLeft := len(mps.Items)+len(ms.Items) > 0
	var objs []client.Object
	byShard := map[string][]string{}
	for i := range sgs.Items {
		objs = append(objs, &sgs.Items[i])
		byShard[sgs.Items[i].Spec.Shard] = append(byShard[sgs.Items[i].Spec.Shard], sgs.Items[i].Spec.Group)
	}
	for i := range pools.Items {
		objs = append(objs, &pools.Items[i])
	}
	for i := range machines.Items {
		objs = append(objs, &machines.Items[i])
	}
	var names []string
	for _, o := range objs {
		kind := strings.TrimPrefix(fmt.Sprintf("%T", o), "*v1beta1.")
		names = append(names, kind+"/"+o.GetName())
		if o.GetDeletionTimestamp().IsZero() && DeletedWithCluster(o.GetOwnerReferences(), capiLeft) {
			if err := r.Client.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
				return nil, nil, fmt.Errorf("delete %s %s/%s with its Cluster: %w", kind, namespace, o.GetName(), err)
			}
		}
	}
	return names, byShard, nil
}

// askShard reports the members of groups (the shard's own plus all) still
// on shard; static groups (the shard's config file keeps them) are left out.
func (r *Reconciler) askShard(ctx context.Context, shard string, own, all []string) ShardState {
	st := ShardState{Shard: shard, Groups: dedupe(own)}
	if !r.Conns.Healthy(shard) {
		st.Err = "connection to the shard is not ready"
		return st
	}
	c, err := r.Conns.Client(shard)
	if err != nil {
		st.Err = err.Error()
		return st
	}
	cctx, cancel := context.WithTimeout(ctx, cmp.Or(r.CallTimeout, 10*time.Second))
	defer cancel()
	gl, err := c.ListGroups(cctx, &nstancev1.ListGroupsRequest{})
	if err != nil {
		st.Err = status.Convert(err).Message()
		return st
	}
	static := map[string]bool{}
	for _, g := range gl.GetGroups() {
		if g.GetStatic() {
			static[g.GetSpec().GetGroupId()] = true
		}
	}
	groups := slices.DeleteFunc(dedupe(append(slices.Clone(own), all...)), func(g string) bool { return static[g] })
	if len(groups) == 0 {
		// An empty filter would list every instance of the shard.
		return st
	}
	resp, err := c.ListInstances(cctx, &nstancev1.ListInstancesRequest{GroupIds: groups})
	if err != nil {
		st.Err = status.Convert(err).Message()
		return st
	}
	for _, inst := range resp.GetInstances() {
		if len(shardgroup.Remaining([]*nstancev1.InstanceStatus{inst})) == 0 {
			continue
		}
		if st.Left == nil {
			st.Left = map[string][]string{}
		}
		st.Left[inst.GetGroupId()] = append(st.Left[inst.GetGroupId()], inst.GetInstanceId())
	}
	return st
}

func dedupe(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}
