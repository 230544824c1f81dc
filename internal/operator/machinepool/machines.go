package machinepool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/labels/format"
	"sigs.k8s.io/cluster-api/util/patch"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/watchfilter"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachines,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machines,verbs=get;list;watch;patch;delete

// syncMachines keeps one NstanceMachine per instance of the pool (the
// Cluster API MachinePool Machines contract), named after the instance,
// labelled with the MachinePool's name and cluster and owned (not
// controlled: core CAPI's Machine becomes the controller) by the pool.
//
// The members are the provider IDs the shard groups report (group members
// that are not being deleted; on-demand instances of the group are not
// members). An NstanceMachine is created only for an instance the server
// lists as active at that moment, so a lagging shard group status never
// brings back the NstanceMachine of an instance being deleted. One whose
// instance the server no longer has is removed with its Machine; one whose
// instance is being deleted is left to the drain coordinator, which drains
// it and then deletes the Machine.
//
// While a rollout has shards that are not up to date (and until every
// NstanceMachine says so again) the members are listed to keep each
// NstanceMachine's UpToDate condition: core Cluster API marks every
// MachinePool Machine UpToDate, so an outdated member shows here.
func (r *Reconciler) syncMachines(ctx context.Context, pool *infrav1.NstanceMachinePool, mp *clusterv1.MachinePool, sgs []infrav1.NstanceShardGroup, rollout *poolRollout) error {
	if r.Conns == nil {
		return nil
	}
	members := map[string]string{} // provider ID -> shard
	for _, sg := range sgs {
		for _, pid := range sg.Status.ProviderIDs {
			members[pid] = sg.Spec.Shard
		}
	}
	mirrors, err := r.poolMachines(ctx, pool)
	if err != nil {
		return err
	}
	byPID := map[string]*infrav1.NstanceMachine{}
	lookup := map[string]bool{} // shards to ask for their instances
	var extra []*infrav1.NstanceMachine
	for i := range mirrors {
		nm := &mirrors[i]
		byPID[nm.Spec.ProviderID] = nm
		if _, ok := members[nm.Spec.ProviderID]; !ok && nm.DeletionTimestamp.IsZero() {
			extra = append(extra, nm)
			lookup[nm.Spec.Shard] = true
		}
	}
	for pid, shard := range members {
		if byPID[pid] == nil {
			lookup[shard] = true
		}
	}
	if rollout != nil {
		for _, shard := range rollout.plan.Outdated {
			lookup[shard] = true
		}
	}
	for i := range mirrors {
		if mirrors[i].DeletionTimestamp.IsZero() && !conditions.IsTrue(&mirrors[i], infrav1.UpToDateCondition) {
			lookup[mirrors[i].Spec.Shard] = true
		}
	}
	if len(lookup) == 0 {
		return nil
	}
	instances := map[string]*nstancev1.InstanceStatus{} // by provider ID
	for _, shard := range slices.Sorted(maps.Keys(lookup)) {
		cl, err := r.Conns.Client(shard)
		if err != nil {
			return fmt.Errorf("list instances of group %s on shard %s: %w", pool.Spec.Group, shard, err)
		}
		resp, err := cl.ListInstances(ctx, &nstancev1.ListInstancesRequest{GroupIds: []string{pool.Spec.Group}})
		if err != nil {
			return fmt.Errorf("list instances of group %s on shard %s: %w", pool.Spec.Group, shard, err)
		}
		for _, inst := range resp.GetInstances() {
			if inst.GetShard() == "" {
				inst.Shard = shard
			}
			instances[inst.GetProviderId()] = inst
		}
	}
	var errs []error
	for _, pid := range slices.Sorted(maps.Keys(members)) {
		inst := instances[pid]
		if byPID[pid] != nil || inst == nil || !activeState(inst.GetState()) {
			continue
		}
		if err := r.createPoolMachine(ctx, pool, mp, members[pid], inst); err != nil {
			errs = append(errs, err)
		}
	}
	for i := range mirrors {
		nm := &mirrors[i]
		if inst := instances[nm.Spec.ProviderID]; inst != nil && nm.DeletionTimestamp.IsZero() && activeState(inst.GetState()) {
			if err := r.markUpToDate(ctx, nm, inst); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, nm := range extra {
		inst := instances[nm.Spec.ProviderID]
		if inst != nil && inst.GetState() != nstancev1.InstanceState_INSTANCE_STATE_DELETED {
			continue
		}
		if err := r.removeGoneMachine(ctx, nm); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// markUpToDate sets nm's UpToDate condition from what the server says of
// its instance (InstanceStatus.outdated), when it changes.
func (r *Reconciler) markUpToDate(ctx context.Context, nm *infrav1.NstanceMachine, inst *nstancev1.InstanceStatus) error {
	want := metav1.Condition{Type: infrav1.UpToDateCondition, Status: metav1.ConditionTrue, Reason: infrav1.UpToDateReason}
	if inst.GetOutdated() {
		want.Status, want.Reason = metav1.ConditionFalse, infrav1.NotUpToDateReason
		want.Message = "instance " + inst.GetInstanceId() + " was created with other infra settings than its group now has; the pool's rollout replaces it"
	}
	if c := conditions.Get(nm, infrav1.UpToDateCondition); c != nil && c.Status == want.Status && c.Reason == want.Reason {
		return nil
	}
	helper, err := patch.NewHelper(nm, r.Client)
	if err != nil {
		return fmt.Errorf("patch helper for NstanceMachine %s: %w", nm.Name, err)
	}
	conditions.Set(nm, want)
	if err := helper.Patch(ctx, nm); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("mark NstanceMachine %s up to date=%s: %w", nm.Name, want.Status, err))
	}
	return nil
}

// poolMachines lists the NstanceMachines mirroring the pool's instances.
func (r *Reconciler) poolMachines(ctx context.Context, pool *infrav1.NstanceMachinePool) ([]infrav1.NstanceMachine, error) {
	var list infrav1.NstanceMachineList
	if err := r.Client.List(ctx, &list, client.InNamespace(pool.Namespace), client.MatchingLabels{infrav1.GroupLabel: pool.Spec.Group}); err != nil {
		return nil, fmt.Errorf("list NstanceMachines of group %s: %w", pool.Spec.Group, err)
	}
	out := list.Items[:0]
	for _, nm := range list.Items {
		if infrav1.PoolInstanceID(&nm) != "" && slices.ContainsFunc(nm.OwnerReferences, func(ref metav1.OwnerReference) bool { return ref.UID == pool.UID }) {
			out = append(out, nm)
		}
	}
	return out, nil
}

func activeState(s nstancev1.InstanceState) bool {
	switch s {
	case nstancev1.InstanceState_INSTANCE_STATE_PENDING, nstancev1.InstanceState_INSTANCE_STATE_CREATING,
		nstancev1.InstanceState_INSTANCE_STATE_RUNNING, nstancev1.InstanceState_INSTANCE_STATE_UNHEALTHY,
		nstancev1.InstanceState_INSTANCE_STATE_STOPPED:
		return true
	}
	return false
}

func (r *Reconciler) createPoolMachine(ctx context.Context, pool *infrav1.NstanceMachinePool, mp *clusterv1.MachinePool, shard string, inst *nstancev1.InstanceStatus) error {
	nm := &infrav1.NstanceMachine{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: pool.Namespace, Name: inst.GetInstanceId(),
			Labels: map[string]string{
				clusterv1.ClusterNameLabel:     mp.Spec.ClusterName,
				clusterv1.MachinePoolNameLabel: format.MustFormatValue(mp.Name),
				infrav1.GroupLabel:             pool.Spec.Group,
				infrav1.ShardLabel:             shard,
			},
			Annotations: map[string]string{infrav1.PoolInstanceAnnotation: inst.GetInstanceId()},
		},
		Spec: infrav1.NstanceMachineSpec{
			ProviderID: inst.GetProviderId(), Group: pool.Spec.Group, Shard: shard,
			Template: pool.Spec.Template, InstanceType: pool.Spec.InstanceType, SubnetPool: pool.Spec.SubnetPool, Image: pool.Spec.Image,
		},
	}
	watchfilter.Inherit(pool, nm)
	if err := controllerutil.SetOwnerReference(pool, nm, r.Client.Scheme()); err != nil {
		return fmt.Errorf("own NstanceMachine %s: %w", nm.Name, err)
	}
	if err := r.Client.Create(ctx, nm); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return nil
		}
		return fmt.Errorf("create NstanceMachine %s for instance %s: %w", nm.Name, inst.GetInstanceId(), err)
	}
	log.FromContext(ctx).V(1).Info("NstanceMachine created for pool instance", "instance", inst.GetInstanceId(), "shard", shard)
	return nil
}

// removeGoneMachine removes what stands for an instance the server no
// longer has: the owning Machine, marked so that core CAPI neither drains
// the Node of the gone VM nor waits for its volumes (CAPI then deletes the
// NstanceMachine), or the NstanceMachine itself while it has no Machine.
// The drain coordinator does the same on the server's deleted event; this
// covers an event missed while the operator was away.
func (r *Reconciler) removeGoneMachine(ctx context.Context, nm *infrav1.NstanceMachine) error {
	for _, ref := range nm.OwnerReferences {
		if ref.Kind != "Machine" || !strings.HasPrefix(ref.APIVersion, clusterv1.GroupVersion.Group+"/") {
			continue
		}
		var m clusterv1.Machine
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: nm.Namespace, Name: ref.Name}, &m); err != nil {
			return client.IgnoreNotFound(err)
		}
		if m.UID != ref.UID || !m.DeletionTimestamp.IsZero() {
			return nil
		}
		why := "instance " + infrav1.PoolInstanceID(nm) + " no longer exists"
		patch := client.MergeFromWithOptions(m.DeepCopy(), client.MergeFromWithOptimisticLock{})
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[clusterv1.ExcludeNodeDrainingAnnotation] = why
		m.Annotations[clusterv1.ExcludeWaitForNodeVolumeDetachAnnotation] = why
		if err := r.Client.Patch(ctx, &m, patch); err != nil {
			return client.IgnoreNotFound(fmt.Errorf("mark Machine %s: %w", m.Name, err))
		}
		if err := r.Client.Delete(ctx, &m, client.Preconditions{UID: &ref.UID}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete Machine %s: %w", m.Name, err)
		}
		return nil
	}
	if err := r.Client.Delete(ctx, nm); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete NstanceMachine %s: %w", nm.Name, err)
	}
	return nil
}
