package machine

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/shardconn"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machinepools,verbs=get;list;watch;patch

// Reasons specific to the NstanceMachines of pool instances.
const (
	ReasonPoolInstance = "PoolInstance"
	// ReasonReplaced: the instance of a deleted MachinePool Machine was
	// deleted; its group replaces it, as a MachineSet replaces a Machine.
	ReasonReplaced = "Replaced"
)

// reconcilePoolMachine handles an NstanceMachine that mirrors an instance
// of a pool's group (created by the pool for core CAPI's MachinePool
// Machines). Unlike other NstanceMachines it never creates an instance: it
// reports the one named by its annotation (provider ID, addresses, Ready).
// Its deletion, which core CAPI starts when the Machine is deleted, removes
// exactly that instance, and its group replaces it.
func (r *Reconciler) reconcilePoolMachine(ctx context.Context, nm *infrav1.NstanceMachine, id string) (reconcile.Result, error) {
	nm.Status.InstanceID, nm.Status.Shard, nm.Status.FailureDomain = id, nm.Spec.Shard, nm.Spec.Shard
	cl, err := r.Conns.Client(nm.Spec.Shard)
	if err != nil {
		if !nm.DeletionTimestamp.IsZero() && controllerutil.ContainsFinalizer(nm, Finalizer) {
			if done, aerr := r.abandonOnDelete(ctx, nm, "instance "+id+" of group "+nm.Spec.Group, err); done || aerr != nil {
				return reconcile.Result{}, aerr
			}
		}
		reason := ReasonShardUnreachable
		if errors.Is(err, shardconn.ErrUnknownShard) {
			reason = ReasonUnknownShard
		}
		setCond(nm, ConditionReady, metav1.ConditionUnknown, reason, err.Error())
		return reconcile.Result{RequeueAfter: r.poll()}, nil
	}
	resp, err := cl.GetInstanceStatus(ctx, &nstancev1.GetInstanceStatusRequest{Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: id}})
	gone := status.Code(err) == codes.NotFound || resp.GetInstance().GetState() == nstancev1.InstanceState_INSTANCE_STATE_DELETED
	if err != nil && !gone && !nm.DeletionTimestamp.IsZero() && controllerutil.ContainsFinalizer(nm, Finalizer) {
		if done, aerr := r.abandonOnDelete(ctx, nm, "instance "+id+" of group "+nm.Spec.Group, err); done || aerr != nil {
			return reconcile.Result{}, aerr
		}
	}
	if err != nil && !gone {
		setCond(nm, ConditionReady, metav1.ConditionUnknown, ReasonShardUnreachable, status.Convert(err).Message())
		return reconcile.Result{RequeueAfter: r.poll()}, nil
	}
	if !nm.DeletionTimestamp.IsZero() {
		return r.deletePoolMachine(ctx, nm, id, resp.GetInstance(), gone)
	}
	setCond(nm, ConditionInstanceCreated, metav1.ConditionTrue, ReasonPoolInstance, "instance "+id+" of group "+nm.Spec.Group+" on shard "+nm.Spec.Shard)
	if gone {
		// The pool removes this NstanceMachine (with its Machine).
		nm.Status.Ready, nm.Status.State = false, "deleted"
		setCond(nm, ConditionReady, metav1.ConditionFalse, ReasonInstanceGone, "the instance no longer exists on shard "+nm.Spec.Shard)
		return reconcile.Result{}, nil
	}
	inst := resp.GetInstance()
	nm.Status.State = stateName(inst.GetState())
	nm.Status.Addresses = addresses(inst.GetAddresses())
	if inst.GetState() != nstancev1.InstanceState_INSTANCE_STATE_RUNNING {
		nm.Status.Ready = false
		setCond(nm, ConditionReady, metav1.ConditionFalse, ReasonInstanceNotRunning, "instance is "+nm.Status.State)
		return reconcile.Result{RequeueAfter: r.poll()}, nil
	}
	nm.Spec.ProviderID = inst.GetProviderId()
	nm.Status.Ready = true
	nm.Status.Initialization.Provisioned = ptr.To(true)
	setCond(nm, ConditionReady, metav1.ConditionTrue, ReasonInstanceRunning, "instance "+id+" is running")
	return reconcile.Result{}, nil
}

// deletePoolMachine removes the instance of a deleting pool NstanceMachine
// the way core CAPI's MachineSet treats a deleted Machine: the instance is
// deleted (without a second drain when core CAPI drained its Node) and the
// group replaces it, so the MachinePool keeps its replicas. Lowering the
// pool is the scale subresource's job: cluster-autoscaler annotates the
// Machine with delete-machine and lowers the MachinePool, and the pool's
// scale-down planner removes exactly that instance. An instance already
// being removed by the server is waited for. The finalizer goes once the
// instance is gone (with the release record an earlier version may have
// left on the MachinePool).
func (r *Reconciler) deletePoolMachine(ctx context.Context, nm *infrav1.NstanceMachine, id string, inst *nstancev1.InstanceStatus, gone bool) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(nm, Finalizer) {
		return reconcile.Result{}, nil
	}
	if gone {
		mp, err := util.GetMachinePoolByLabels(ctx, r.Client, nm.Namespace, nm.Labels)
		if err != nil {
			return reconcile.Result{}, fmt.Errorf("find the MachinePool of NstanceMachine %s: %w", nm.Name, err)
		}
		if err := r.forgetRelease(ctx, mp, nm); err != nil {
			return reconcile.Result{}, err
		}
		// The deferred patch removes it; the object may then be gone at once.
		controllerutil.RemoveFinalizer(nm, Finalizer)
		return reconcile.Result{}, nil
	}
	nm.Status.Ready = false
	nm.Status.State = stateName(inst.GetState())
	cl, err := r.Conns.Client(nm.Spec.Shard)
	if err != nil {
		return reconcile.Result{RequeueAfter: r.poll()}, nil
	}
	skipDrain, err := r.drainedByCAPI(ctx, nm)
	if err != nil {
		return reconcile.Result{}, err
	}
	switch st := inst.GetState(); {
	case st == nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION && skipDrain:
		// The server chose it for removal meanwhile and announced a drain
		// that core CAPI has done already.
		if _, err := cl.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: id, SkipDrain: true}); err != nil && status.Code(err) != codes.NotFound {
			return reconcile.Result{}, fmt.Errorf("DeleteInstance %s on shard %s: %w", id, nm.Spec.Shard, err)
		}
	case st == nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION || st == nstancev1.InstanceState_INSTANCE_STATE_DELETING:
		// Being removed by the server already.
	default:
		if _, err := cl.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: id, SkipDrain: skipDrain}); err != nil && status.Code(err) != codes.NotFound {
			return reconcile.Result{}, fmt.Errorf("DeleteInstance %s on shard %s: %w", id, nm.Spec.Shard, err)
		}
		if r.Recorder != nil {
			r.Recorder.Eventf(nm, nil, corev1.EventTypeNormal, ReasonReplaced, "Delete", "instance %s deleted with its Machine; its group replaces it", id)
		}
	}
	setCond(nm, ConditionReady, metav1.ConditionFalse, ReasonDeleting, "waiting for instance "+id+" to be deleted")
	return reconcile.Result{RequeueAfter: r.poll()}, nil
}

func releaseKey(nm *infrav1.NstanceMachine) string {
	return infrav1.ReleasedAnnotationPrefix + string(nm.UID)
}

// forgetRelease removes nm's record from mp once its instance is gone. mp
// is read again from the API server: a cached copy that missed the record
// would leave it behind for good.
func (r *Reconciler) forgetRelease(ctx context.Context, mp *clusterv1.MachinePool, nm *infrav1.NstanceMachine) error {
	if mp == nil {
		return nil
	}
	reader := r.Reader
	if reader == nil {
		reader = r.Client
	}
	if err := reader.Get(ctx, client.ObjectKeyFromObject(mp), mp); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("get MachinePool %s: %w", mp.Name, err))
	}
	if _, ok := mp.Annotations[releaseKey(nm)]; !ok {
		return nil
	}
	patch := client.MergeFrom(mp.DeepCopy())
	delete(mp.Annotations, releaseKey(nm))
	if err := r.Client.Patch(ctx, mp, patch); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("remove %s from MachinePool %s: %w", releaseKey(nm), mp.Name, err))
	}
	return nil
}
