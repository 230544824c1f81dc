package machinepool

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/finalizers"
	"sigs.k8s.io/cluster-api/util/patch"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/capacity"
	"github.com/nstance-dev/nstance/internal/operator/ledger"
	"github.com/nstance-dev/nstance/internal/operator/paused"
	"github.com/nstance-dev/nstance/internal/operator/shardconn"
	"github.com/nstance-dev/nstance/internal/operator/userdata"
	"github.com/nstance-dev/nstance/internal/operator/watchfilter"
)

// InfraRefIndex indexes MachinePools by the name of the NstanceMachinePool
// their spec.template.spec.infrastructureRef names.
const InfraRefIndex = "nstance.dev/infrastructure-ref"

// Condition reasons specific to pools.
const (
	// WaitingForMachinePoolReason: no MachinePool references the pool yet,
	// so its size is unknown.
	WaitingForMachinePoolReason = "WaitingForMachinePool"
	// ShardGroupsNotReadyReason: some shard groups are not Ready.
	ShardGroupsNotReadyReason = "ShardGroupsNotReady"
)

// Reconciler syncs NstanceMachinePools into NstanceShardGroups.
type Reconciler struct {
	// WatchFilter restricts the controller to objects labelled with it
	// (--watch-filter); empty means every object.
	WatchFilter watchfilter.Filter
	Client      client.Client
	Ledger      *ledger.Ledger
	// Conns lists a group's instances for the pool's NstanceMachines
	// (MachinePool Machines); nil leaves them out.
	Conns *shardconn.Manager
	// Reader reads the shard groups and Machines a scale-down is planned
	// from, uncached; nil uses Client.
	Reader client.Reader
	// Recorder names each scale-down victim in an Event; nil records none.
	Recorder events.EventRecorder
	// Capacity publishes status.capacity and nodeInfo (scale from zero);
	// nil leaves them out.
	Capacity *capacity.Catalog
	// SyncShardGroup, when set, is given each shard group this pass
	// created or changed, as the API server returned it, to send its spec
	// to the shard at once (the shard group controller's SyncNow) instead
	// of after the shard group's watch event and reconcile. The calls for
	// a pool's shards run in parallel.
	SyncShardGroup func(ctx context.Context, sg *infrav1.NstanceShardGroup)
}

// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachinepools,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachinepools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachinepools/finalizers,verbs=update
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstanceshardgroups,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machinepools,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;list;watch;create;patch;update

// InfraRefName extracts the index value of a MachinePool.
func InfraRefName(o client.Object) []string {
	mp, ok := o.(*clusterv1.MachinePool)
	if !ok {
		return nil
	}
	ref := mp.Spec.Template.Spec.InfrastructureRef
	if ref.APIGroup != infrav1.GroupVersion.Group || ref.Kind != "NstanceMachinePool" || ref.Name == "" {
		return nil
	}
	return []string{ref.Name}
}

// Reconcile implements reconcile.Reconciler. Changes to the pool are
// written once, at the end, by Cluster API's patch helper. A paused pool
// (its Cluster's spec.paused, or its own paused annotation) gets its Paused
// condition and nothing else; so does a pool whose MachinePool carries the
// paused annotation.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	var pool infrav1.NstanceMachinePool
	if err := r.Client.Get(ctx, req.NamespacedName, &pool); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !r.WatchFilter.Matches(&pool) {
		return ctrl.Result{}, nil // another operator's (--watch-filter)
	}
	log := log.FromContext(ctx).WithValues("group", pool.Spec.Group)
	ctx = ctrl.LoggerInto(ctx, log)
	if _, stop, err := paused.EnsureDeferred(ctx, r.Client, &pool); err != nil || stop {
		return ctrl.Result{}, err
	}

	mp, err := r.machinePool(ctx, &pool)
	if err != nil {
		return ctrl.Result{}, err
	}
	if mp != nil && annotations.HasPaused(mp) {
		log.V(1).Info("reconciliation paused by the MachinePool")
		return ctrl.Result{}, nil
	}
	if pool.DeletionTimestamp.IsZero() {
		if err := r.Ledger.Record(ctx, pool.Spec.Group, ledger.StateManaged); err != nil {
			return ctrl.Result{}, err
		}
		if _, err := finalizers.EnsureFinalizer(ctx, r.Client, &pool, infrav1.MachinePoolFinalizer); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer: %w", err)
		}
	}
	helper, err := patch.NewHelper(&pool, r.Client)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("patch helper for NstanceMachinePool %s: %w", pool.Name, err)
	}
	paused.SetNotPaused(&pool) // written by the deferred patch (EnsureDeferred)
	defer func() {
		if err := helper.Patch(ctx, &pool, patch.WithOwnedConditions{Conditions: []string{clusterv1.PausedCondition, infrav1.ReadyCondition, infrav1.RollingOutCondition}}); err != nil {
			retErr = errors.Join(retErr, fmt.Errorf("patch NstanceMachinePool %s: %w", pool.Name, err))
		}
	}()
	if !pool.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.reconcileDelete(ctx, &pool)
	}
	return ctrl.Result{}, r.reconcileNormal(ctx, &pool, mp)
}

// machinePool finds the MachinePool that uses pool as its infrastructure:
// the owner set by core CAPI, else one whose infrastructureRef names it.
func (r *Reconciler) machinePool(ctx context.Context, pool *infrav1.NstanceMachinePool) (*clusterv1.MachinePool, error) {
	for _, ref := range pool.OwnerReferences {
		if ref.Kind != "MachinePool" || !strings.HasPrefix(ref.APIVersion, clusterv1.GroupVersion.Group+"/") {
			continue
		}
		var mp clusterv1.MachinePool
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: pool.Namespace, Name: ref.Name}, &mp)
		if err == nil {
			return &mp, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("get MachinePool %s: %w", ref.Name, err)
		}
	}
	var list clusterv1.MachinePoolList
	if err := r.Client.List(ctx, &list, client.InNamespace(pool.Namespace), client.MatchingFields{InfraRefIndex: pool.Name}); err != nil {
		return nil, fmt.Errorf("list MachinePools: %w", err)
	}
	if len(list.Items) == 0 {
		return nil, nil
	}
	// Several MachinePools naming one pool is a user error; take the oldest.
	slices.SortFunc(list.Items, func(a, b clusterv1.MachinePool) int {
		return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	})
	return &list.Items[0], nil
}

func (r *Reconciler) shardGroups(ctx context.Context, pool *infrav1.NstanceMachinePool) ([]infrav1.NstanceShardGroup, error) {
	var list infrav1.NstanceShardGroupList
	if err := r.Client.List(ctx, &list, client.InNamespace(pool.Namespace), client.MatchingLabels{infrav1.GroupLabel: pool.Spec.Group}); err != nil {
		return nil, fmt.Errorf("list shard groups: %w", err)
	}
	out := list.Items[:0]
	for _, sg := range list.Items {
		if metav1.IsControlledBy(&sg, pool) {
			out = append(out, sg)
		}
	}
	return out, nil
}

func (r *Reconciler) reconcileDelete(ctx context.Context, pool *infrav1.NstanceMachinePool) error {
	if !controllerutil.ContainsFinalizer(pool, infrav1.MachinePoolFinalizer) {
		return nil
	}
	// Record first: from now on the import never brings this group back.
	if err := r.Ledger.Record(ctx, pool.Spec.Group, ledger.StateDeleted); err != nil {
		return err
	}
	sgs, err := r.shardGroups(ctx, pool)
	if err != nil {
		return err
	}
	for i := range sgs {
		if sgs[i].DeletionTimestamp.IsZero() {
			if err := r.Client.Delete(ctx, &sgs[i]); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete shard group %s: %w", sgs[i].Name, err)
			}
		}
	}
	if len(sgs) > 0 {
		setCond(pool, infrav1.ReadyCondition, false, infrav1.DeletingReason, fmt.Sprintf("waiting for %d shard groups to be deleted", len(sgs)))
		// The shard groups' deletion events bring us back here.
		return nil
	}
	// The deferred patch removes it; the object may then be gone at once.
	controllerutil.RemoveFinalizer(pool, infrav1.MachinePoolFinalizer)
	return nil
}

func (r *Reconciler) reconcileNormal(ctx context.Context, pool *infrav1.NstanceMachinePool, mp *clusterv1.MachinePool) error {
	var desired int32
	// Until the bootstrap provider names the data Secret, no shard group is
	// created or changed: the servers keep what they run (a shard group
	// already there keeps its size and data).
	var secret string
	var rollout *poolRollout
	waitingForData := false
	if mp != nil {
		var ready bool
		secret, ready = userdata.SecretName(mp.Spec.Template.Spec.Bootstrap.DataSecretName)
		waitingForData = !ready
	}
	if mp != nil && !waitingForData {
		desired = ptr.Deref(mp.Spec.Replicas, 1)
		sizes, err := r.sizes(ctx, pool, mp, desired)
		if err != nil {
			return err
		}
		if rollout, err = r.planRollout(ctx, pool, sizes, secret, desired); err != nil {
			return err
		}
		var written []*infrav1.NstanceShardGroup
		for _, shard := range pool.Spec.Shards {
			var budget *infrav1.ShardRollout
			if b, ok := rollout.plan.Budgets[shard]; ok && !static(pool) {
				budget = &b
			}
			sg, err := r.ensureShardGroup(ctx, pool, mp, shard, sizes[shard], secret, budget)
			if err != nil {
				return err
			}
			if sg != nil {
				written = append(written, sg)
			}
		}
		r.syncShardGroups(ctx, written)
	}
	sgs, err := r.shardGroups(ctx, pool)
	if err != nil {
		return err
	}
	// Shard groups of shards removed from spec.shards go away (not while
	// waiting for bootstrap data: nothing changes on the servers then).
	keep := make([]infrav1.NstanceShardGroup, 0, len(sgs))
	for i := range sgs {
		if waitingForData || slices.Contains(pool.Spec.Shards, sgs[i].Spec.Shard) {
			keep = append(keep, sgs[i])
			continue
		}
		if sgs[i].DeletionTimestamp.IsZero() {
			if err := r.Client.Delete(ctx, &sgs[i]); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete shard group %s: %w", sgs[i].Name, err)
			}
		}
	}

	if waitingForData {
		desired = ptr.Deref(mp.Spec.Replicas, 1)
	}
	agg := Aggregate(keep, pool.Spec.Shards, desired)
	switch {
	case mp == nil:
		agg.Ready = false
		agg.Reason, agg.Message = WaitingForMachinePoolReason, "no MachinePool references this pool"
	case waitingForData:
		agg.Ready = false
		agg.Reason = infrav1.WaitingForBootstrapDataReason
		agg.Message = "waiting for spec.template.spec.bootstrap.dataSecretName of MachinePool " + mp.Name
	}
	if !slices.Equal(pool.Spec.ProviderIDList, agg.ProviderIDs) {
		pool.Spec.ProviderIDList = agg.ProviderIDs
	}
	pool.Status.Replicas = agg.Replicas
	pool.Status.ReadyReplicas = agg.ReadyReplicas
	capacity.SetPool(ctx, r.Capacity, pool)
	// Provisioned (and ready, which core CAPI's MachinePool controller reads
	// as provisioned) latch: once every shard has the group, CAPI follows
	// replicas and provider IDs through scaling and outages. Convergence
	// is the Ready condition.
	if mp != nil && agg.Provisioned {
		pool.Status.Ready = true
		pool.Status.Initialization.Provisioned = ptr.To(true)
	}
	pool.Status.ObservedGeneration = pool.Generation
	setCond(pool, infrav1.ReadyCondition, agg.Ready, agg.Reason, agg.Message)
	if rollout != nil {
		r.reportRollout(pool, rollout, desired)
	}
	if mp != nil {
		pool.Status.InfrastructureMachineKind = infrav1.PoolMachineKind
		return r.syncMachines(ctx, pool, mp, keep, rollout)
	}
	return nil
}

// syncShardGroups hands the shard groups written in this pass to
// SyncShardGroup, one goroutine per shard, and waits for them.
func (r *Reconciler) syncShardGroups(ctx context.Context, sgs []*infrav1.NstanceShardGroup) {
	if r.SyncShardGroup == nil || len(sgs) == 0 {
		return
	}
	var wg sync.WaitGroup
	for _, sg := range sgs {
		wg.Go(func() { r.SyncShardGroup(ctx, sg) })
	}
	wg.Wait()
}

// ensureShardGroup creates or patches the shard group of pool on shard and
// returns it as the API server wrote it, or nil when nothing changed.
func (r *Reconciler) ensureShardGroup(ctx context.Context, pool *infrav1.NstanceMachinePool, mp *clusterv1.MachinePool, shard string, size int32, secret string, budget *infrav1.ShardRollout) (*infrav1.NstanceShardGroup, error) {
	sg := &infrav1.NstanceShardGroup{ObjectMeta: metav1.ObjectMeta{
		Namespace: pool.Namespace, Name: infrav1.ShardGroupName(pool.Spec.Group, shard),
	}}
	op, err := controllerutil.CreateOrPatch(ctx, r.Client, sg, func() error {
		if !sg.DeletionTimestamp.IsZero() {
			return nil
		}
		if sg.CreationTimestamp.IsZero() {
			// Created with the finalizer its controller would add first:
			// one write (and one reconcile) less per shard group.
			controllerutil.AddFinalizer(sg, infrav1.ShardGroupFinalizer)
		}
		if sg.Labels == nil {
			sg.Labels = map[string]string{}
		}
		watchfilter.Inherit(pool, sg)
		sg.Labels[infrav1.GroupLabel] = pool.Spec.Group
		sg.Labels[infrav1.ShardLabel] = shard
		if mp.Spec.ClusterName != "" {
			sg.Labels[clusterv1.ClusterNameLabel] = mp.Spec.ClusterName
		}
		if err := controllerutil.SetControllerReference(pool, sg, r.Client.Scheme()); err != nil {
			return err
		}
		sg.Spec.Group = pool.Spec.Group
		sg.Spec.Shard = shard
		sg.Spec.Size = size
		sg.Spec.Template = pool.Spec.Template
		sg.Spec.InstanceType = pool.Spec.InstanceType
		sg.Spec.SubnetPool = pool.Spec.SubnetPool
		sg.Spec.Vars = maps.Clone(pool.Spec.Vars)
		sg.Spec.DrainTimeout = pool.Spec.DrainTimeout.DeepCopy()
		sg.Spec.BootstrapDataSecretName = secret
		sg.Spec.Image = pool.Spec.Image
		sg.Spec.Rollout = budget
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("create or update shard group %s: %w", sg.Name, err)
	}
	if op == controllerutil.OperationResultNone {
		return nil, nil
	}
	log.FromContext(ctx).V(1).Info("shard group "+string(op), "shardGroup", sg.Name, "size", size)
	return sg, nil
}

func setCond(pool *infrav1.NstanceMachinePool, typ string, ok bool, reason, msg string) {
	st := metav1.ConditionFalse
	if ok {
		st = metav1.ConditionTrue
	}
	conditions.Set(pool, metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg})
}

// Summary is a pool's status derived from its shard groups.
type Summary struct {
	ProviderIDs   []string
	Replicas      int32
	ReadyReplicas int32
	// Provisioned: every shard has a shard group its server accepted.
	Provisioned bool
	// Ready: converged, see Aggregate.
	Ready   bool
	Reason  string
	Message string
}

// Aggregate summarises the shard groups of a pool that wants desired
// replicas over shards. The pool is provisioned when every shard has a
// shard group whose server accepted it (ConfigValid), and ready when every
// shard has a Ready shard group and the instance count equals desired.
func Aggregate(sgs []infrav1.NstanceShardGroup, shards []string, desired int32) Summary {
	var s Summary
	ids := map[string]struct{}{}
	byShard := map[string]*infrav1.NstanceShardGroup{}
	for i := range sgs {
		sg := &sgs[i]
		byShard[sg.Spec.Shard] = sg
		s.Replicas += sg.Status.Replicas
		s.ReadyReplicas += sg.Status.ReadyReplicas
		for _, id := range sg.Status.ProviderIDs {
			ids[id] = struct{}{}
		}
	}
	if len(ids) > 0 {
		s.ProviderIDs = slices.Sorted(maps.Keys(ids))
	}
	var notReady []string
	s.Provisioned = len(shards) > 0
	for _, shard := range shards {
		sg, ok := byShard[shard]
		if !ok {
			s.Provisioned = false
			notReady = append(notReady, shard+" (no shard group)")
			continue
		}
		if !conditions.IsTrue(sg, infrav1.ConfigValidCondition) {
			s.Provisioned = false
		}
		c := conditions.Get(sg, infrav1.ReadyCondition)
		if c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != sg.Generation {
			why := "not synced"
			if c != nil && c.Reason != "" {
				why = c.Reason
			}
			notReady = append(notReady, shard+" ("+why+")")
		}
	}
	switch {
	case len(notReady) > 0:
		s.Reason = ShardGroupsNotReadyReason
		s.Message = "shard groups not ready: " + strings.Join(notReady, ", ")
	case s.Replicas != desired:
		s.Reason = infrav1.WaitingForReplicasReason
		s.Message = fmt.Sprintf("%d of %d instances exist", s.Replicas, desired)
	default:
		s.Ready = true
		s.Reason = infrav1.SyncedReason
	}
	return s
}
