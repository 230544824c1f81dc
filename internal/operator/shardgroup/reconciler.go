package shardgroup

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/finalizers"
	"sigs.k8s.io/cluster-api/util/patch"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/abandon"
	"github.com/nstance-dev/nstance/internal/operator/ledger"
	"github.com/nstance-dev/nstance/internal/operator/metrics"
	"github.com/nstance-dev/nstance/internal/operator/paused"
	"github.com/nstance-dev/nstance/internal/operator/shardconn"
	"github.com/nstance-dev/nstance/internal/operator/userdata"
	"github.com/nstance-dev/nstance/internal/operator/watch"
	"github.com/nstance-dev/nstance/internal/operator/watchfilter"
	"github.com/nstance-dev/nstance/internal/operator/webhook"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Event reasons. Problems with bootstrap data are reported with the
// condition reasons of api/v1beta1 (BootstrapDataSecretNotFound,
// BootstrapDataSecretInvalid, BootstrapDataRejected).
const (
	EventShardUnreachable = "ShardUnreachable"
	EventConfigRejected   = "ConfigRejected"
	EventGroupDeleted     = "GroupDeleted"
	EventUnknownShard     = "UnknownShard"
	EventStaticGroupKept  = "StaticGroupKept"
)

// ReasonDeletingInstances (Ready false): the server accepted DeleteGroup and
// still has members of the group; the finalizer stays until it has none.
const ReasonDeletingInstances = "DeletingInstances"

// Reconciler syncs NstanceShardGroups to the servers.
type Reconciler struct {
	// WatchFilter restricts the controller to objects labelled with it
	// (--watch-filter); empty means every object.
	WatchFilter watchfilter.Filter
	Client      client.Client
	// Reader reads bootstrap data Secrets uncached (the manager's cache
	// does not hold them); nil means Client.
	Reader   client.Reader
	Conns    *shardconn.Manager
	Groups   *watch.Cache
	Recorder events.EventRecorder
	Metrics  *metrics.Metrics
	// Ledger records groups left on a shard without DeleteGroup (removed
	// from the configuration, or abandoned while unreachable), for the
	// Reaper to delete when the shard is back; nil records nothing.
	Ledger *ledger.Ledger
	// RetryDelay is how soon an unreachable shard is retried; zero means 5s.
	RetryDelay time.Duration
	// CallTimeout bounds one RPC; zero means 10s.
	CallTimeout time.Duration
	// Now defaults to time.Now.
	Now func() time.Time

	// sent orders the upserts of Reconcile and SyncNow.
	sent sentGuard
}

// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstanceshardgroups,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstanceshardgroups/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstanceshardgroups/finalizers,verbs=update
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachinepools,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch;update

func (r *Reconciler) retry() time.Duration {
	if r.RetryDelay > 0 {
		return r.RetryDelay
	}
	return 5 * time.Second
}

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Reconciler) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	d := r.CallTimeout
	if d <= 0 {
		d = 10 * time.Second
	}
	return context.WithTimeout(ctx, d)
}

// Reconcile implements reconcile.Reconciler. Changes to the shard group
// are written once, at the end, by Cluster API's patch helper. A paused
// shard group (its Cluster's spec.paused, or its own paused annotation)
// gets its Paused condition and nothing else; so does one whose owning pool
// carries the paused annotation.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	var sg infrav1.NstanceShardGroup
	if err := r.Client.Get(ctx, req.NamespacedName, &sg); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !r.WatchFilter.Matches(&sg) {
		return ctrl.Result{}, nil // another operator's (--watch-filter)
	}
	log := log.FromContext(ctx).WithValues("group", sg.Spec.Group, "shard", sg.Spec.Shard)
	ctx = ctrl.LoggerInto(ctx, log)
	if _, stop, err := paused.EnsureDeferred(ctx, r.Client, &sg); err != nil || stop {
		return ctrl.Result{}, err
	}
	owner, err := r.ownerPool(ctx, &sg)
	if err != nil {
		return ctrl.Result{}, err
	}
	if owner != nil && annotations.HasPaused(owner) {
		log.V(1).Info("reconciliation paused by the owning pool")
		return ctrl.Result{}, nil
	}
	if sg.DeletionTimestamp.IsZero() {
		if _, err := finalizers.EnsureFinalizer(ctx, r.Client, &sg, infrav1.ShardGroupFinalizer); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer: %w", err)
		}
	}
	helper, err := patch.NewHelper(&sg, r.Client)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("patch helper for NstanceShardGroup %s: %w", sg.Name, err)
	}
	paused.SetNotPaused(&sg) // written by the deferred patch (EnsureDeferred)
	defer func() {
		if err := helper.Patch(ctx, &sg, patch.WithOwnedConditions{Conditions: []string{clusterv1.PausedCondition,
			infrav1.ReadyCondition, infrav1.ShardReachableCondition, infrav1.ConfigValidCondition}}); err != nil {
			retErr = errors.Join(retErr, fmt.Errorf("patch NstanceShardGroup %s: %w", sg.Name, err))
		}
	}()
	if !sg.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, &sg, owner != nil && webhook.IsStatic(owner))
	}
	if err := r.ensureClusterOwner(ctx, &sg); err != nil {
		return ctrl.Result{}, err
	}
	return r.reconcileNormal(ctx, &sg)
}

// ensureClusterOwner makes the Cluster of a shard group that nothing owns
// (the MachineDeployment template declares one for its NstanceMachines'
// group, and a template cannot know the Cluster's UID) its owner, as core
// CAPI does for an infrastructure cluster: the shard group then goes with
// its Cluster, and clusterctl move finds it through the owner chain. The
// deferred patch writes it.
func (r *Reconciler) ensureClusterOwner(ctx context.Context, sg *infrav1.NstanceShardGroup) error {
	name := sg.Labels[clusterv1.ClusterNameLabel]
	if len(sg.OwnerReferences) > 0 || name == "" {
		return nil
	}
	var cl clusterv1.Cluster
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: sg.Namespace, Name: name}, &cl); err != nil {
		if kerrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("get Cluster %s of shard group %s: %w", name, sg.Name, err)
	}
	sg.OwnerReferences = util.EnsureOwnerRef(sg.OwnerReferences, metav1.OwnerReference{
		APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: cl.Name, UID: cl.UID,
	})
	return nil
}

func (r *Reconciler) ownerPool(ctx context.Context, sg *infrav1.NstanceShardGroup) (*infrav1.NstanceMachinePool, error) {
	ref := metav1.GetControllerOf(sg)
	if ref == nil || ref.Kind != "NstanceMachinePool" {
		return nil, nil
	}
	var pool infrav1.NstanceMachinePool
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: sg.Namespace, Name: ref.Name}, &pool); err != nil {
		if kerrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("get owning pool: %w", err)
	}
	return &pool, nil
}

// reconcileDelete deletes the server group and keeps the finalizer until the
// server reports no member of it (Remaining), so a deletion upstream (the
// pool, the Cluster) waits for every VM of the group, surge ones included.
// The group of a static pool is defined in the shard's config file, which
// the server refuses to change: deleting the pool only stops mirroring it.
func (r *Reconciler) reconcileDelete(ctx context.Context, sg *infrav1.NstanceShardGroup, static bool) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(sg, infrav1.ShardGroupFinalizer) {
		return ctrl.Result{}, nil
	}
	if static {
		r.Recorder.Eventf(sg, nil, corev1.EventTypeNormal, EventStaticGroupKept, "Delete",
			"group %s on shard %s is defined in the shard's config file and stays there", sg.Spec.Group, sg.Spec.Shard)
		return ctrl.Result{}, r.removeFinalizer(ctx, sg)
	}
	shard := sg.Spec.Shard
	if !r.Conns.Known(shard) {
		if err := r.recordOrphan(ctx, sg); err != nil {
			return ctrl.Result{}, err
		}
		r.Recorder.Eventf(sg, nil, corev1.EventTypeWarning, EventUnknownShard, "Delete",
			"shard %q is not configured; releasing the finalizer, group %s is deleted there when the shard is configured again", shard, sg.Spec.Group)
		return ctrl.Result{}, r.removeFinalizer(ctx, sg)
	}
	c, err := r.Conns.Client(shard)
	if errors.Is(err, shardconn.ErrNotStarted) {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	cctx, cancel := r.callCtx(ctx)
	start := time.Now()
	_, err = c.DeleteGroup(cctx, &nstancev1.DeleteGroupRequest{GroupId: sg.Spec.Group})
	cancel()
	r.Metrics.ObserveSync(shard, "delete", time.Since(start), err)
	if err != nil && status.Code(err) != codes.NotFound {
		if unreachable(err) {
			return r.unreachableOnDelete(ctx, sg, err)
		}
		return ctrl.Result{}, fmt.Errorf("DeleteGroup %s on shard %s: %w", sg.Spec.Group, shard, err)
	}
	r.Groups.Delete(shard, sg.Spec.Group)
	cctx, cancel = r.callCtx(ctx)
	resp, err := c.ListInstances(cctx, &nstancev1.ListInstancesRequest{GroupIds: []string{sg.Spec.Group}})
	cancel()
	if err != nil {
		if unreachable(err) {
			return r.unreachableOnDelete(ctx, sg, err)
		}
		return ctrl.Result{}, fmt.Errorf("ListInstances of deleted group %s on shard %s: %w", sg.Spec.Group, shard, err)
	}
	if left := Remaining(resp.GetInstances()); len(left) > 0 {
		conditions.Set(sg, metav1.Condition{Type: infrav1.ReadyCondition, Status: metav1.ConditionFalse, Reason: ReasonDeletingInstances,
			Message: fmt.Sprintf("group %s deleted on shard %s; waiting for %d instances to go: %s", sg.Spec.Group, shard, len(left), strings.Join(left, ", "))})
		return ctrl.Result{RequeueAfter: r.deletePoll()}, nil
	}
	r.Recorder.Eventf(sg, nil, corev1.EventTypeNormal, EventGroupDeleted, "Delete", "group %s deleted on shard %s, no instance left", sg.Spec.Group, shard)
	r.sent.forget(sg)
	return ctrl.Result{}, r.removeFinalizer(ctx, sg)
}

// unreachableOnDelete handles a deleted shard group whose shard cannot be
// reached: it waits (ShardReachable false, retried), unless the Cluster
// carries the abandon annotation; then the group is recorded as orphaned
// (deleted when the shard is reachable again), a Warning Event names it and
// the instances last seen in it, and the finalizer goes.
func (r *Reconciler) unreachableOnDelete(ctx context.Context, sg *infrav1.NstanceShardGroup, cause error) (ctrl.Result, error) {
	ok, err := abandon.Requested(ctx, r.Client, sg)
	if err != nil {
		return ctrl.Result{}, err
	}
	if !ok {
		return r.markUnreachable(ctx, sg, cause)
	}
	if err := r.recordOrphan(ctx, sg); err != nil {
		return ctrl.Result{}, err
	}
	last := "none known"
	if len(sg.Status.ProviderIDs) > 0 {
		last = strings.Join(sg.Status.ProviderIDs, ", ")
	}
	r.Recorder.Eventf(sg, nil, corev1.EventTypeWarning, abandon.EventReason, "Delete",
		"shard %s is unreachable (%s) and the Cluster carries %s: group %s abandoned on shard %s with its instances (last seen: %s); "+
			"the operator deletes the group when the shard is reachable again",
		sg.Spec.Shard, status.Convert(cause).Message(), infrav1.AbandonInstancesAnnotation, sg.Spec.Group, sg.Spec.Shard, last)
	log.FromContext(ctx).Info("abandoned a deleted group on an unreachable shard", "lastSeen", last)
	return ctrl.Result{}, r.removeFinalizer(ctx, sg)
}

func (r *Reconciler) recordOrphan(ctx context.Context, sg *infrav1.NstanceShardGroup) error {
	if r.Ledger == nil {
		return nil
	}
	if err := r.Ledger.RecordOrphan(ctx, sg.Spec.Group, sg.Spec.Shard); err != nil {
		return fmt.Errorf("record group %s as left on shard %s: %w", sg.Spec.Group, sg.Spec.Shard, err)
	}
	return nil
}

// Remaining returns the IDs of the instances that keep a deleted group's
// shard group: members of the group (instances created on demand, with a
// client token, belong to their NstanceMachines) whose VM may still exist,
// which is every state but DELETED and FAILED (the provider could not
// create it).
func Remaining(insts []*nstancev1.InstanceStatus) []string {
	var out []string
	for _, i := range insts {
		if i.GetClientToken() != "" {
			continue
		}
		switch i.GetState() {
		case nstancev1.InstanceState_INSTANCE_STATE_DELETED, nstancev1.InstanceState_INSTANCE_STATE_FAILED:
			continue
		}
		out = append(out, i.GetInstanceId())
	}
	return out
}

// deletePoll is how often a deleted group's members are looked at again:
// instance deletions bring no group event.
func (r *Reconciler) deletePoll() time.Duration {
	return min(r.retry(), 2*time.Second)
}

// removeFinalizer lets the shard group go; the deferred patch writes it.
func (r *Reconciler) removeFinalizer(_ context.Context, sg *infrav1.NstanceShardGroup) error {
	controllerutil.RemoveFinalizer(sg, infrav1.ShardGroupFinalizer)
	return nil
}

func (r *Reconciler) reconcileNormal(ctx context.Context, sg *infrav1.NstanceShardGroup) (ctrl.Result, error) {
	shard := sg.Spec.Shard
	before := sg.Status.DeepCopy()
	if !r.Conns.Known(shard) {
		setCond(sg, infrav1.ShardReachableCondition, false, infrav1.UnknownShardReason, fmt.Sprintf("shard %q is not in the operator configuration", shard))
		setCond(sg, infrav1.ReadyCondition, false, infrav1.UnknownShardReason, "shard is not configured")
		if cond := meta.FindStatusCondition(before.Conditions, infrav1.ShardReachableCondition); cond == nil || cond.Reason != infrav1.UnknownShardReason {
			r.Recorder.Eventf(sg, nil, corev1.EventTypeWarning, EventUnknownShard, "Sync", "shard %q is not in the operator configuration", shard)
		}
		return ctrl.Result{}, nil
	}
	c, err := r.Conns.Client(shard)
	if errors.Is(err, shardconn.ErrNotStarted) {
		return ctrl.Result{RequeueAfter: time.Second}, nil
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	if !r.Conns.Healthy(shard) {
		return r.markUnreachable(ctx, sg, errors.New("connection to the shard is not ready"))
	}

	data, res, stop := r.bootstrapData(ctx, sg, before)
	if stop {
		return res, nil
	}
	desired := DesiredSpec(sg, data)
	sent := r.sent.lock(sg)
	defer sent.mu.Unlock()
	if sent.outdated(sg.UID, sg.Generation) {
		// This copy of the shard group (the cache's) is older than the
		// one SyncNow has sent: its spec would undo the newer one. The
		// newer one's watch event brings a pass of its own.
		log.FromContext(ctx).V(1).Info("shard group copy older than the spec sent; waiting for the newer one", "generation", sg.Generation)
		return ctrl.Result{}, nil
	}
	current, cached := r.Groups.Get(shard, sg.Spec.Group)
	upserted := false
	if !cached || !SpecMatches(desired, current) {
		cctx, cancel := r.callCtx(ctx)
		start := time.Now()
		resp, err := c.UpsertGroup(cctx, &nstancev1.UpsertGroupRequest{Group: desired})
		cancel()
		r.Metrics.ObserveSync(shard, "upsert", time.Since(start), err)
		if err == nil {
			sent.record(sg.UID, sg.Generation)
		}
		if err != nil {
			switch {
			case unreachable(err):
				return r.markUnreachable(ctx, sg, err)
			case rejected(err):
				// With bootstrap data attached the refusal may be about it
				// (the server's size limit): the message names the Secret
				// and the size, never the content.
				reason, msg := infrav1.ConfigRejectedReason, status.Convert(err).Message()
				if !data.Empty() && status.Code(err) == codes.InvalidArgument {
					reason = infrav1.BootstrapDataRejectedReason
					msg = fmt.Sprintf("%s (bootstrap data from Secret %s, %d bytes)", msg, data.Secret, len(data.Value))
				}
				setCond(sg, infrav1.ShardReachableCondition, true, infrav1.ShardConnectedReason, "")
				setCond(sg, infrav1.ConfigValidCondition, false, reason, msg)
				setCond(sg, infrav1.ReadyCondition, false, reason, "the server rejected the group")
				if cond := meta.FindStatusCondition(before.Conditions, infrav1.ConfigValidCondition); cond == nil || cond.Status != metav1.ConditionFalse || cond.Message != msg {
					r.Recorder.Eventf(sg, nil, corev1.EventTypeWarning, reason, "Sync", "shard %s rejected group %s: %s", shard, sg.Spec.Group, msg)
				}
				sg.Status.ObservedGeneration = sg.Generation
				// A rejected spec needs a spec change; retry slowly in case the
				// server's config changed meanwhile.
				return ctrl.Result{RequeueAfter: time.Minute}, nil
			default:
				setCond(sg, infrav1.ReadyCondition, false, infrav1.SyncFailedReason, err.Error())
				return ctrl.Result{}, fmt.Errorf("UpsertGroup %s on shard %s: %w", sg.Spec.Group, shard, err)
			}
		}
		r.Groups.PutResponse(shard, resp.GetGroup())
		current, _ = r.Groups.Get(shard, sg.Spec.Group)
		upserted = true
	}

	applyServerStatus(sg, current)
	// current is the server's answer to exactly this spec: its
	// up_to_date_count counts against these infra settings.
	sg.Status.ObservedInfra = sg.Spec.InfraDigest()
	if upserted || sg.Status.LastSyncTime == nil || sg.Status.ObservedGeneration != sg.Generation {
		now := metav1.NewTime(r.now())
		sg.Status.LastSyncTime = &now
	}
	sg.Status.ObservedGeneration = sg.Generation
	setCond(sg, infrav1.ShardReachableCondition, true, infrav1.ShardConnectedReason, "")
	setCond(sg, infrav1.ConfigValidCondition, true, infrav1.ConfigAcceptedReason, "")
	if sg.Status.Replicas == sg.Spec.Size {
		setCond(sg, infrav1.ReadyCondition, true, infrav1.SyncedReason, "")
	} else {
		setCond(sg, infrav1.ReadyCondition, false, infrav1.WaitingForReplicasReason,
			fmt.Sprintf("%d of %d instances exist", sg.Status.Replicas, sg.Spec.Size))
	}
	return ctrl.Result{}, nil
}

func (r *Reconciler) markUnreachable(ctx context.Context, sg *infrav1.NstanceShardGroup, cause error) (ctrl.Result, error) {
	before := sg.Status.DeepCopy()
	msg := cause.Error()
	if s, ok := status.FromError(cause); ok {
		msg = s.Message()
	}
	prev := meta.FindStatusCondition(before.Conditions, infrav1.ShardReachableCondition)
	if prev == nil || prev.Status != metav1.ConditionFalse {
		r.Recorder.Eventf(sg, nil, corev1.EventTypeWarning, EventShardUnreachable, "Sync", "shard %s is unreachable: %s", sg.Spec.Shard, msg)
	}
	setCond(sg, infrav1.ShardReachableCondition, false, infrav1.ShardUnreachableReason, msg)
	setCond(sg, infrav1.ReadyCondition, false, infrav1.ShardUnreachableReason, "shard is unreachable")
	return ctrl.Result{RequeueAfter: r.retry()}, nil
}

// applyServerStatus copies the server's view of the group into the status.
func applyServerStatus(sg *infrav1.NstanceShardGroup, g *nstancev1.GroupStatus) {
	sg.Status.Replicas = int32(g.GetActualSize())
	sg.Status.ReadyReplicas = int32(g.GetReadyCount())
	sg.Status.UpToDateReplicas = int32(g.GetUpToDateCount())
	ids := slices.Clone(g.GetProviderIds())
	slices.Sort(ids)
	if len(ids) == 0 {
		ids = nil
	}
	sg.Status.ProviderIDs = ids
}

func setCond(sg *infrav1.NstanceShardGroup, typ string, ok bool, reason, msg string) {
	st := metav1.ConditionFalse
	if ok {
		st = metav1.ConditionTrue
	}
	conditions.Set(sg, metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg})
}

// bootstrapData reads the shard group's bootstrap data Secret. When it is
// missing or unusable, the group is left as the server has it (its
// instances keep running with their current data): the conditions and, on
// a change, a Warning Event say why, and stop is true. Secrets are not
// watched, so the pass comes back by itself.
func (r *Reconciler) bootstrapData(ctx context.Context, sg *infrav1.NstanceShardGroup, before *infrav1.NstanceShardGroupStatus) (userdata.Data, ctrl.Result, bool) {
	reader := r.Reader
	if reader == nil {
		reader = r.Client
	}
	data, err := userdata.Read(ctx, reader, sg.Namespace, sg.Spec.BootstrapDataSecretName)
	if err == nil {
		return data, ctrl.Result{}, false
	}
	var nf *userdata.NotFoundError
	var invalid *userdata.InvalidError
	reason, retry := infrav1.SyncFailedReason, r.retry()
	switch {
	case errors.As(err, &nf):
		reason = infrav1.BootstrapDataSecretNotFoundReason
	case errors.As(err, &invalid):
		reason, retry = infrav1.BootstrapDataSecretInvalidReason, 30*time.Second
	}
	msg := err.Error()
	setCond(sg, infrav1.ConfigValidCondition, false, reason, msg)
	setCond(sg, infrav1.ReadyCondition, false, reason, "the group is not changed until its bootstrap data can be read")
	if cond := meta.FindStatusCondition(before.Conditions, infrav1.ConfigValidCondition); cond == nil || cond.Reason != reason || cond.Message != msg {
		r.Recorder.Eventf(sg, nil, corev1.EventTypeWarning, reason, "Sync", "group %s on shard %s: %s", sg.Spec.Group, sg.Spec.Shard, msg)
	}
	log.FromContext(ctx).V(1).Info("bootstrap data not usable", "reason", reason, "secret", sg.Spec.BootstrapDataSecretName)
	return userdata.Data{}, ctrl.Result{RequeueAfter: retry}, true
}

// DesiredSpec is the server group spec an NstanceShardGroup asks for, with
// data (read from its bootstrap data Secret) as the group's user data.
func DesiredSpec(sg *infrav1.NstanceShardGroup, data userdata.Data) *nstancev1.GroupSpec {
	spec := &nstancev1.GroupSpec{
		GroupId:      sg.Spec.Group,
		Template:     sg.Spec.Template,
		Size:         uint32(max(sg.Spec.Size, 0)),
		InstanceType: sg.Spec.InstanceType,
		SubnetPool:   sg.Spec.SubnetPool,
		Image:        sg.Spec.Image,
	}
	// An empty strategy is the server's default, which it reports as none.
	if r := sg.Spec.Rollout; r != nil && (r.MaxSurge != nil || r.MaxUnavailable != 0 || r.Paused) {
		spec.Rollout = &nstancev1.RolloutStrategy{MaxUnavailable: uint32(max(r.MaxUnavailable, 0)), Paused: r.Paused}
		if r.MaxSurge != nil {
			spec.Rollout.MaxSurge = proto.Uint32(uint32(max(*r.MaxSurge, 0)))
		}
	}
	if !data.Empty() {
		spec.UserData, spec.UserDataFormat = data.Value, data.Format
	}
	if len(sg.Spec.Vars) > 0 {
		spec.Vars = maps.Clone(sg.Spec.Vars)
	}
	if sg.Spec.DrainTimeout != nil {
		spec.DrainTimeout = durationpb.New(sg.Spec.DrainTimeout.Duration)
	}
	return spec
}

// SpecMatches reports whether the server's group (current) already has what
// desired asks for. Fields left empty in desired are the server's to
// default and not compared, except the user data: the server never returns
// it, only its hash (GroupStatus.user_data_sha256, "" for none), which must
// equal the hash of desired's, empty or not, so a group whose data was
// removed is updated too. The format is compared only when the server
// reports one. The image is compared as it is ("" is the template's, so a
// removed image is sent too), the rollout strategy when desired has one.
func SpecMatches(desired *nstancev1.GroupSpec, current *nstancev1.GroupStatus) bool {
	server := current.GetSpec()
	if server == nil || desired.GetGroupId() != server.GetGroupId() || desired.GetSize() != server.GetSize() {
		return false
	}
	if desired.GetImage() != server.GetImage() {
		return false
	}
	if desired.GetRollout() != nil && !proto.Equal(desired.GetRollout(), server.GetRollout()) {
		return false
	}
	if userdata.Hash(desired.GetUserData()) != current.GetUserDataSha256() {
		return false
	}
	if len(desired.GetUserData()) > 0 && server.GetUserDataFormat() != "" && desired.GetUserDataFormat() != server.GetUserDataFormat() {
		return false
	}
	for _, f := range [][2]string{
		{desired.GetTemplate(), server.GetTemplate()},
		{desired.GetInstanceType(), server.GetInstanceType()},
		{desired.GetSubnetPool(), server.GetSubnetPool()},
	} {
		if f[0] != "" && f[0] != f[1] {
			return false
		}
	}
	if len(desired.GetVars()) > 0 && !maps.Equal(desired.GetVars(), server.GetVars()) {
		return false
	}
	// 0 (no drain) is not unset: the server's must be present and equal.
	if d := desired.GetDrainTimeout(); d != nil && (server.GetDrainTimeout() == nil || d.AsDuration() != server.GetDrainTimeout().AsDuration()) {
		return false
	}
	return true
}

// unreachable reports errors meaning the shard could not be talked to.
func unreachable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	return false
}

// rejected reports errors meaning the server refused the group spec.
func rejected(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied, codes.AlreadyExists:
		return true
	}
	return false
}
