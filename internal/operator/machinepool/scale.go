package machinepool

import (
	"context"
	"fmt"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/labels/format"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// EventScaleDownVictim is the Event reason naming an instance a pool's
// scale-down removes.
const EventScaleDownVictim = "ScaleDownVictim"

func (r *Reconciler) reader() client.Reader {
	if r.Reader != nil {
		return r.Reader
	}
	return r.Client
}

// sizes applies PlanReplicas for pool at desired replicas and returns the
// size of each shard's group. The current sizes are read uncached, so a
// stale cache never makes a scale-down look pending twice: one GET by name
// per shard (the pool's shard groups are named ShardGroupName), not a list
// of every shard group, which the API server reads in full from etcd for
// each pass (quadratic over an import of 1,000 pools). For a
// scale-down it reads the members (ListInstances on each shard) and their
// Machines (uncached: cluster-autoscaler annotates the Machine just before
// it lowers the MachinePool) and marks every victim on its shard
// (DeleteInstance with on_scale_down) before the sizes are returned: the
// server then removes exactly the marked members when the groups shrink.
// Marking is idempotent and the plan depends only on what it reads, so a
// retry or a restart between marking and writing the sizes marks the same
// instances again.
func (r *Reconciler) sizes(ctx context.Context, pool *infrav1.NstanceMachinePool, mp *clusterv1.MachinePool, desired int32) (map[string]int32, error) {
	current := map[string]int32{}
	var total int32
	for _, shard := range slices.Compact(slices.Sorted(slices.Values(pool.Spec.Shards))) {
		var sg infrav1.NstanceShardGroup
		err := r.reader().Get(ctx, client.ObjectKey{Namespace: pool.Namespace, Name: infrav1.ShardGroupName(pool.Spec.Group, shard)}, &sg)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("get shard group of group %s on shard %s: %w", pool.Spec.Group, shard, err)
		}
		if metav1.IsControlledBy(&sg, pool) && sg.DeletionTimestamp.IsZero() && sg.Spec.Shard == shard {
			current[shard] = sg.Spec.Size
			total += sg.Spec.Size
		}
	}
	if desired >= total || r.Conns == nil {
		return PlanReplicas(pool.Spec.Shards, current, nil, desired, pool.Spec.DeletePolicy).Sizes, nil
	}
	members, err := r.members(ctx, pool, mp, current)
	if err != nil {
		return nil, err
	}
	plan := PlanReplicas(pool.Spec.Shards, current, members, desired, pool.Spec.DeletePolicy)
	for _, v := range plan.Victims {
		cl, err := r.Conns.Client(v.Shard)
		if err != nil {
			return nil, fmt.Errorf("mark instance %s for scale-down on shard %s: %w", v.InstanceID, v.Shard, err)
		}
		_, err = cl.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: v.InstanceID, OnScaleDown: true})
		if err != nil && status.Code(err) != codes.NotFound {
			return nil, fmt.Errorf("mark instance %s for scale-down on shard %s: %w", v.InstanceID, v.Shard, err)
		}
		log.FromContext(ctx).Info("scale-down victim marked", "instance", v.InstanceID, "shard", v.Shard,
			"deleteMachine", v.DeleteMachine, "deleting", v.Deleting, "policy", pool.Spec.DeletePolicy)
		if r.Recorder != nil {
			r.Recorder.Eventf(pool, nil, corev1.EventTypeNormal, EventScaleDownVictim, "ScaleDown", "instance %s on shard %s is removed by the scale-down to %d (%s)",
				v.InstanceID, v.Shard, desired, victimReason(v, pool.Spec.DeletePolicy))
		}
	}
	return plan.Sizes, nil
}

func victimReason(v Member, policy infrav1.DeletePolicy) string {
	switch {
	case v.Deleting:
		return "its Machine is being deleted"
	case v.DeleteMachine:
		return "its Machine carries " + clusterv1.DeleteMachineAnnotation
	case v.Unhealthy:
		return "unhealthy"
	}
	if policy == "" {
		policy = infrav1.DeletePolicyRandom
	}
	return "deletePolicy " + string(policy)
}

// members lists the active members of the pool's group on the shards that
// have replicas, with what their Machines say. On-demand instances of the
// group (those of the group's NstanceMachines that are not pool mirrors)
// are no members.
func (r *Reconciler) members(ctx context.Context, pool *infrav1.NstanceMachinePool, mp *clusterv1.MachinePool, current map[string]int32) ([]Member, error) {
	var nms infrav1.NstanceMachineList
	if err := r.Client.List(ctx, &nms, client.InNamespace(pool.Namespace), client.MatchingLabels{infrav1.GroupLabel: pool.Spec.Group}); err != nil {
		return nil, fmt.Errorf("list NstanceMachines of group %s: %w", pool.Spec.Group, err)
	}
	onDemand := map[string]bool{}
	for _, nm := range nms.Items {
		if infrav1.PoolInstanceID(&nm) == "" && nm.Status.InstanceID != "" {
			onDemand[nm.Status.InstanceID] = true
		}
	}
	var machines clusterv1.MachineList
	if err := r.reader().List(ctx, &machines, client.InNamespace(pool.Namespace),
		client.MatchingLabels{clusterv1.MachinePoolNameLabel: format.MustFormatValue(mp.Name)}); err != nil {
		return nil, fmt.Errorf("list Machines of MachinePool %s: %w", mp.Name, err)
	}
	byInstance := map[string]*clusterv1.Machine{} // NstanceMachine name = instance id
	for i := range machines.Items {
		m := &machines.Items[i]
		if m.Spec.InfrastructureRef.Kind == infrav1.PoolMachineKind {
			byInstance[m.Spec.InfrastructureRef.Name] = m
		}
	}
	var out []Member
	for _, shard := range pool.Spec.Shards {
		if current[shard] == 0 {
			continue
		}
		cl, err := r.Conns.Client(shard)
		if err != nil {
			return nil, fmt.Errorf("list instances of group %s on shard %s: %w", pool.Spec.Group, shard, err)
		}
		resp, err := cl.ListInstances(ctx, &nstancev1.ListInstancesRequest{GroupIds: []string{pool.Spec.Group}})
		if err != nil {
			return nil, fmt.Errorf("list instances of group %s on shard %s: %w", pool.Spec.Group, shard, err)
		}
		for _, inst := range resp.GetInstances() {
			id := inst.GetInstanceId()
			if !activeState(inst.GetState()) || onDemand[id] {
				continue
			}
			m := Member{Shard: shard, InstanceID: id, Created: inst.GetCreatedAt().AsTime(),
				Unhealthy: inst.GetState() != nstancev1.InstanceState_INSTANCE_STATE_RUNNING}
			if mach := byInstance[id]; mach != nil {
				_, m.DeleteMachine = mach.Annotations[clusterv1.DeleteMachineAnnotation]
				m.Deleting = !mach.DeletionTimestamp.IsZero()
			}
			out = append(out, m)
		}
	}
	return out, nil
}
