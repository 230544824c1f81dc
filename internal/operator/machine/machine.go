package machine

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
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
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/finalizers"
	"sigs.k8s.io/cluster-api/util/patch"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/abandon"
	"github.com/nstance-dev/nstance/internal/operator/paused"
	"github.com/nstance-dev/nstance/internal/operator/shardconn"
	"github.com/nstance-dev/nstance/internal/operator/userdata"
	"github.com/nstance-dev/nstance/internal/operator/watchfilter"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachines,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachines/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachines/finalizers,verbs=update
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachinetemplates,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machines,verbs=get;list;watch

// Finalizer keeps an NstanceMachine until its instance is deleted.
const Finalizer = "nstancemachine.infrastructure.cluster.x-k8s.io"

// CreateNonceAnnotation holds the random part of an NstanceMachine's
// create token (see CreateToken). The operator stores it before the
// instance is created; clusterctl move carries it with the object.
const CreateNonceAnnotation = "nstance.dev/create-nonce"

// Condition types and reasons on NstanceMachines.
const (
	ConditionReady            = "Ready"
	ConditionInstanceCreated  = "InstanceCreated"
	ReasonWaitingForMachine   = "WaitingForMachine"
	ReasonUnknownShard        = "UnknownShard"
	ReasonCreateFailed        = "CreateFailed"
	ReasonCreated             = "Created"
	ReasonInstanceRunning     = "InstanceRunning"
	ReasonInstanceNotRunning  = "InstanceNotRunning"
	ReasonInstanceGone        = "InstanceGone"
	ReasonDeleting            = "Deleting"
	ReasonCreating            = "Creating"
	ReasonAdopted             = "Adopted"
	ReasonShardUnreachable    = "ShardUnreachable"
	instanceLabelMachine      = "nstance.dev/machine"
	instanceLabelMachineSpace = "nstance.dev/namespace"
)

// Reconciler reconciles NstanceMachines.
type Reconciler struct {
	// WatchFilter restricts the controller to objects labelled with it
	// (--watch-filter); empty means every object.
	WatchFilter watchfilter.Filter
	Client      client.Client
	// Reader reads owning Machines uncached when deciding whether core
	// Cluster API drained a Node already, and bootstrap data Secrets (the
	// manager's cache does not hold them); nil means Client.
	Reader    client.Reader
	Conns     *shardconn.Manager
	Recorder  events.EventRecorder
	Namespace string
	// DefaultShard is used when neither spec.shard nor the owning
	// Machine's failureDomain names one: the first configured shard.
	DefaultShard string
	// PollInterval re-reads a pending instance; zero means 2s.
	PollInterval time.Duration
	Log          logr.Logger
}

// SetupWithManager registers the controller. A Cluster that is paused or
// unpaused brings its NstanceMachines back at once.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, workers int) error {
	b := ctrl.NewControllerManagedBy(mgr).
		For(&infrav1.NstanceMachine{}, r.WatchFilter.For(mgr.GetScheme(), mgr.GetLogger())).
		Watches(&clusterv1.Machine{}, handler.EnqueueRequestsFromMapFunc(machineToInfra)).
		WithOptions(controller.Options{MaxConcurrentReconciles: cmp.Or(workers, 4)})
	b, err := paused.WatchClusters(b, mgr, &infrav1.NstanceMachineList{}, r.Log)
	if err != nil {
		return err
	}
	return b.Complete(r)
}

func machineToInfra(_ context.Context, o client.Object) []reconcile.Request {
	m, ok := o.(*clusterv1.Machine)
	if !ok {
		return nil
	}
	ref := m.Spec.InfrastructureRef
	if ref.Kind != "NstanceMachine" || ref.APIGroup != infrav1.GroupVersion.Group || ref.Name == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: m.Namespace, Name: ref.Name}}}
}

// OwnerMachine returns the Machine named in the NstanceMachine's owner
// references, or nil.
func OwnerMachine(ctx context.Context, c client.Reader, nm *infrav1.NstanceMachine) (*clusterv1.Machine, error) {
	for _, ref := range nm.OwnerReferences {
		if ref.Kind != "Machine" || !strings.HasPrefix(ref.APIVersion, clusterv1.GroupVersion.Group+"/") {
			continue
		}
		var m clusterv1.Machine
		if err := c.Get(ctx, client.ObjectKey{Namespace: nm.Namespace, Name: ref.Name}, &m); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, nil
			}
			return nil, fmt.Errorf("get Machine %s: %w", ref.Name, err)
		}
		return &m, nil
	}
	return nil, nil
}

func (r *Reconciler) poll() time.Duration { return cmp.Or(r.PollInterval, 2*time.Second) }

// Reconcile moves one NstanceMachine towards its instance.
//
// Every change of the pass is written once, at the end, by Cluster API's
// patch helper: metadata and spec first, then status, each as a patch of
// what this pass changed. Nothing written mid-pass can therefore replace the
// in-memory status with the server's (an earlier version wrote
// spec.providerID mid-pass and lost status.instanceID and status.shard when
// the instance was already running), and a pass that changes nothing writes
// nothing. A paused NstanceMachine (its Cluster's spec.paused, or its own
// paused annotation) gets its Paused condition and nothing else.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (_ reconcile.Result, retErr error) {
	var nm infrav1.NstanceMachine
	if err := r.Client.Get(ctx, req.NamespacedName, &nm); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !r.WatchFilter.Matches(&nm) {
		return reconcile.Result{}, nil // another operator's (--watch-filter)
	}
	if _, stop, err := paused.EnsureDeferred(ctx, r.Client, &nm); err != nil || stop {
		return reconcile.Result{}, err
	}
	machine, err := OwnerMachine(ctx, r.Client, &nm)
	if err != nil {
		return reconcile.Result{}, err
	}
	// The finalizer is stored before anything is created on a shard, so an
	// instance never exists without it.
	if _, err := finalizers.EnsureFinalizer(ctx, r.Client, &nm, Finalizer); err != nil {
		return reconcile.Result{}, fmt.Errorf("add finalizer to NstanceMachine %s: %w", nm.Name, err)
	}
	helper, err := patch.NewHelper(&nm, r.Client)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("patch helper for NstanceMachine %s: %w", nm.Name, err)
	}
	paused.SetNotPaused(&nm) // written by the deferred patch (EnsureDeferred)
	defer func() {
		if err := helper.Patch(ctx, &nm, patch.WithStatusObservedGeneration{},
			patch.WithOwnedConditions{Conditions: []string{clusterv1.PausedCondition, ConditionReady, ConditionInstanceCreated, infrav1.UpToDateCondition}}); err != nil {
			retErr = errors.Join(retErr, fmt.Errorf("patch NstanceMachine %s: %w", nm.Name, err))
		}
	}()
	// An NstanceMachine of a pool's instance never creates one (see
	// poolmachine.go); the paths below are for those that do.
	if id := infrav1.PoolInstanceID(&nm); id != "" {
		return r.reconcilePoolMachine(ctx, &nm, id)
	}
	// The spec names the instance; status mirrors it (and is all that
	// clusterctl move leaves out). Objects from before the instance moved
	// into spec carry it in status only.
	if nm.Spec.InstanceID == "" && nm.Status.InstanceID != "" && nm.Status.Shard != "" && cmp.Or(nm.Spec.Shard, nm.Status.Shard) == nm.Status.Shard {
		nm.Spec.InstanceID, nm.Spec.Shard = nm.Status.InstanceID, nm.Status.Shard
	}
	nm.Status.InstanceID, nm.Status.Shard = nm.Spec.InstanceID, ""
	if nm.Spec.InstanceID != "" {
		nm.Status.Shard, nm.Status.FailureDomain = nm.Spec.Shard, nm.Spec.Shard
	}
	if !nm.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, &nm)
	}
	return r.reconcileNormal(ctx, &nm, machine)
}

func setCond(nm *infrav1.NstanceMachine, typ string, st metav1.ConditionStatus, reason, msg string) {
	conditions.Set(nm, metav1.Condition{Type: typ, Status: st, Reason: reason, Message: msg})
}

// CreateToken is the client token an NstanceMachine creates its instance
// with: derived from its namespace, name and its create-nonce annotation,
// all of which clusterctl move keeps. A create retried after a lost reply,
// or repeated by an operator that sees the object after a move before
// spec.instanceID was stored, therefore returns the same instance; a new
// object that reuses the name gets a new nonce and a new instance.
func CreateToken(nm *infrav1.NstanceMachine) string {
	sum := sha256.Sum256([]byte(nm.Namespace + "/" + nm.Name + "/" + nm.Annotations[CreateNonceAnnotation]))
	return "nm-" + hex.EncodeToString(sum[:20])
}

func (r *Reconciler) reconcileNormal(ctx context.Context, nm *infrav1.NstanceMachine, machine *clusterv1.Machine) (reconcile.Result, error) {
	if nm.Spec.InstanceID == "" {
		place := chooseShard(nm, machine, r.DefaultShard)
		if place.shard == "" {
			setCond(nm, ConditionInstanceCreated, metav1.ConditionFalse, place.reason, place.message)
			if place.reason == ReasonShardMismatch {
				// Ready carries it to the Machine's InfrastructureReady.
				setCond(nm, ConditionReady, metav1.ConditionFalse, place.reason, place.message)
				if r.Recorder != nil {
					r.Recorder.Eventf(nm, machine, corev1.EventTypeWarning, place.reason, "Create", "%s", place.message)
				}
			}
			return reconcile.Result{}, nil
		}
		shard := place.shard
		if !r.Conns.Known(shard) {
			setCond(nm, ConditionInstanceCreated, metav1.ConditionFalse, ReasonUnknownShard, fmt.Sprintf("shard %q is not in the operator configuration", shard))
			return reconcile.Result{}, nil
		}
		data, res, stop, err := r.bootstrapData(ctx, nm, machine)
		if err != nil || stop {
			return res, err
		}
		// Shard and nonce are stored before the create call (the deferred
		// patch; its update event brings the next pass), so every attempt,
		// here or after a move, asks the same shard with the same token.
		if nm.Spec.Shard == "" || nm.Annotations[CreateNonceAnnotation] == "" {
			nm.Spec.Shard = shard
			if nm.Annotations[CreateNonceAnnotation] == "" {
				if nm.Annotations == nil {
					nm.Annotations = map[string]string{}
				}
				nm.Annotations[CreateNonceAnnotation] = rand.Text()
			}
			setCond(nm, ConditionInstanceCreated, metav1.ConditionFalse, ReasonCreating, "creating the instance on shard "+shard)
			return reconcile.Result{}, nil
		}
		cl, err := r.Conns.Client(shard)
		if err != nil {
			setCond(nm, ConditionInstanceCreated, metav1.ConditionFalse, ReasonShardUnreachable, err.Error())
			return reconcile.Result{RequeueAfter: r.poll()}, nil
		}
		req := &nstancev1.CreateInstanceRequest{
			GroupId: nm.Spec.Group, Template: nm.Spec.Template, InstanceType: nm.Spec.InstanceType,
			SubnetPool: nm.Spec.SubnetPool, Vars: nm.Spec.Vars, ClientToken: CreateToken(nm), Image: nm.Spec.Image,
			Labels: map[string]string{instanceLabelMachine: nm.Name, instanceLabelMachineSpace: nm.Namespace},
		}
		if !data.Empty() {
			req.UserData, req.UserDataFormat = data.Value, data.Format
		}
		resp, err := cl.CreateInstance(ctx, req)
		if err != nil && !data.Empty() && status.Code(err) == codes.InvalidArgument {
			// Most likely the data itself (the server's size limit): a retry
			// cannot help until the bootstrap data changes. The message names
			// the Secret and the size, never the content.
			msg := fmt.Sprintf("shard %s refused the instance of Machine %s with the bootstrap data of Secret %s (%d bytes): %s",
				shard, machine.Name, data.Secret, len(data.Value), status.Convert(err).Message())
			r.warnOnce(nm, infrav1.BootstrapDataRejectedReason, msg)
			return reconcile.Result{RequeueAfter: time.Minute}, nil
		}
		if err != nil {
			msg := fmt.Sprintf("CreateInstance on shard %s: %v", shard, status.Convert(err).Message())
			setCond(nm, ConditionInstanceCreated, metav1.ConditionFalse, ReasonCreateFailed, msg)
			if r.Recorder != nil {
				r.Recorder.Eventf(nm, nil, corev1.EventTypeWarning, ReasonCreateFailed, "Create", "%s", msg)
			}
			return reconcile.Result{}, fmt.Errorf("%s", msg)
		}
		inst := resp.GetInstance()
		nm.Spec.InstanceID = inst.GetInstanceId()
		nm.Status.InstanceID, nm.Status.Shard, nm.Status.FailureDomain = inst.GetInstanceId(), shard, shard
		setCond(nm, ConditionInstanceCreated, metav1.ConditionTrue, ReasonCreated, "instance "+inst.GetInstanceId()+" created on shard "+shard)
		if r.Recorder != nil {
			r.Recorder.Eventf(nm, nil, corev1.EventTypeNormal, ReasonCreated, "Create", "instance %s created on shard %s", inst.GetInstanceId(), shard)
		}
	} else if !conditions.Has(nm, ConditionInstanceCreated) {
		// Recreated without status (clusterctl move): the instance exists.
		setCond(nm, ConditionInstanceCreated, metav1.ConditionTrue, ReasonAdopted, "instance "+nm.Spec.InstanceID+" on shard "+nm.Spec.Shard)
	}
	cl, err := r.Conns.Client(nm.Spec.Shard)
	if err != nil {
		return reconcile.Result{RequeueAfter: r.poll()}, nil
	}
	resp, err := cl.GetInstanceStatus(ctx, &nstancev1.GetInstanceStatusRequest{Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: nm.Spec.InstanceID}})
	if status.Code(err) == codes.NotFound {
		nm.Status.Ready, nm.Status.State = false, "deleted"
		setCond(nm, ConditionReady, metav1.ConditionFalse, ReasonInstanceGone, "the instance no longer exists on shard "+nm.Spec.Shard)
		return reconcile.Result{}, nil
	}
	if err != nil {
		setCond(nm, ConditionReady, metav1.ConditionUnknown, ReasonShardUnreachable, status.Convert(err).Message())
		return reconcile.Result{RequeueAfter: r.poll()}, nil
	}
	inst := resp.GetInstance()
	nm.Status.State = stateName(inst.GetState())
	nm.Status.Addresses = addresses(inst.GetAddresses())
	if inst.GetState() != nstancev1.InstanceState_INSTANCE_STATE_RUNNING {
		nm.Status.Ready = false
		setCond(nm, ConditionReady, metav1.ConditionFalse, ReasonInstanceNotRunning, "instance is "+nm.Status.State)
		return reconcile.Result{RequeueAfter: r.poll()}, nil
	}
	// Written with the status by the deferred patch: spec first, so
	// providerID is stored before status reports the machine provisioned.
	nm.Spec.ProviderID = inst.GetProviderId()
	nm.Status.Ready = true
	nm.Status.Initialization.Provisioned = ptr.To(true)
	setCond(nm, ConditionReady, metav1.ConditionTrue, ReasonInstanceRunning, "instance "+inst.GetInstanceId()+" is running")
	setUpToDate(nm, inst)
	// Looked at again now and then: a change of the server's template
	// brings no event here.
	return reconcile.Result{RequeueAfter: DriftRecheck}, nil
}

// DriftRecheck is how often a running instance is asked whether it drifted.
const DriftRecheck = 5 * time.Minute

// setUpToDate reports the server's drift verdict on a running instance.
func setUpToDate(nm *infrav1.NstanceMachine, inst *nstancev1.InstanceStatus) {
	if !inst.GetDrifted() {
		setCond(nm, infrav1.UpToDateCondition, metav1.ConditionTrue, infrav1.UpToDateReason,
			"instance "+inst.GetInstanceId()+" matches what shard "+nm.Spec.Shard+" would create now")
		return
	}
	setCond(nm, infrav1.UpToDateCondition, metav1.ConditionFalse, infrav1.DriftedReason, fmt.Sprintf(
		"instance %s was created with other settings (instance type, subnet pool, args or bootstrap data) than template %q gives on shard %s now; "+
			"the server does not replace it: roll the MachineDeployment (a new NstanceMachineTemplate, or clusterctl alpha rollout restart)",
		inst.GetInstanceId(), inst.GetTemplate(), nm.Spec.Shard))
}

// bootstrapData returns the bootstrap data the instance of nm is created
// with, read from the Secret its Machine's spec.bootstrap.dataSecretName
// names. Without an owning Machine (the operator's on-demand NstanceMachines
// before core CAPI links them, or one created on its own) and with an empty
// dataSecretName (what the on-demand and import paths write, and what Cluster
// API itself writes for MachinePool Machines) there is none, and the
// template's userdata applies. While dataSecretName is nil the bootstrap
// provider is not done: like CAPD, nothing is created, the conditions say
// WaitingForBootstrapData and the Machine watch brings the next pass. A
// missing Secret is looked for again shortly; an unusable one (no "value",
// an empty one, an unknown "format") is reported once by a Warning Event and
// looked at again every 30s (Secrets are not watched).
func (r *Reconciler) bootstrapData(ctx context.Context, nm *infrav1.NstanceMachine, machine *clusterv1.Machine) (userdata.Data, reconcile.Result, bool, error) {
	if machine == nil {
		return userdata.Data{}, reconcile.Result{}, false, nil
	}
	name, ready := userdata.SecretName(machine.Spec.Bootstrap.DataSecretName)
	if !ready {
		msg := "waiting for spec.bootstrap.dataSecretName of Machine " + machine.Name
		setCond(nm, ConditionInstanceCreated, metav1.ConditionFalse, infrav1.WaitingForBootstrapDataReason, msg)
		setCond(nm, ConditionReady, metav1.ConditionFalse, infrav1.WaitingForBootstrapDataReason, msg)
		return userdata.Data{}, reconcile.Result{}, true, nil
	}
	reader := r.Reader
	if reader == nil {
		reader = r.Client
	}
	data, err := userdata.Read(ctx, reader, machine.Namespace, name)
	var nf *userdata.NotFoundError
	var invalid *userdata.InvalidError
	switch {
	case err == nil:
		return data, reconcile.Result{}, false, nil
	case errors.As(err, &nf):
		setCond(nm, ConditionInstanceCreated, metav1.ConditionFalse, infrav1.BootstrapDataSecretNotFoundReason, err.Error())
		setCond(nm, ConditionReady, metav1.ConditionFalse, infrav1.BootstrapDataSecretNotFoundReason, err.Error())
		return userdata.Data{}, reconcile.Result{RequeueAfter: r.poll()}, true, nil
	case errors.As(err, &invalid):
		r.warnOnce(nm, infrav1.BootstrapDataSecretInvalidReason, fmt.Sprintf("Machine %s: %v", machine.Name, err))
		return userdata.Data{}, reconcile.Result{RequeueAfter: 30 * time.Second}, true, nil
	default:
		return userdata.Data{}, reconcile.Result{}, true, fmt.Errorf("bootstrap data of Machine %s: %w", machine.Name, err)
	}
}

// warnOnce sets InstanceCreated and Ready false with reason and msg, and
// records a Warning Event unless the condition said so already.
func (r *Reconciler) warnOnce(nm *infrav1.NstanceMachine, reason, msg string) {
	// A copy: conditions.Get points into the list setCond changes.
	var prevReason, prevMsg string
	if prev := conditions.Get(nm, ConditionInstanceCreated); prev != nil {
		prevReason, prevMsg = prev.Reason, prev.Message
	}
	setCond(nm, ConditionInstanceCreated, metav1.ConditionFalse, reason, msg)
	setCond(nm, ConditionReady, metav1.ConditionFalse, reason, msg)
	if r.Recorder != nil && (prevReason != reason || prevMsg != msg) {
		r.Recorder.Eventf(nm, nil, corev1.EventTypeWarning, reason, "Create", "%s", msg)
	}
}

func (r *Reconciler) reconcileDelete(ctx context.Context, nm *infrav1.NstanceMachine) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(nm, Finalizer) {
		return reconcile.Result{}, nil
	}
	if nm.Spec.InstanceID == "" && nm.Spec.Shard != "" && nm.Annotations[CreateNonceAnnotation] != "" {
		// A create may have succeeded without its reply being stored.
		found, err := r.lookupByToken(ctx, nm)
		if err != nil {
			if done, aerr := r.abandonOnDelete(ctx, nm, "the instance created with token "+CreateToken(nm)+", if any", err); done || aerr != nil {
				return reconcile.Result{}, aerr
			}
			setCond(nm, ConditionReady, metav1.ConditionFalse, ReasonShardUnreachable, err.Error())
			return reconcile.Result{RequeueAfter: r.poll()}, nil
		}
		nm.Spec.InstanceID = found
		nm.Status.InstanceID = found
	}
	gone := nm.Spec.InstanceID == ""
	if !gone {
		cl, err := r.Conns.Client(nm.Spec.Shard)
		if err != nil {
			if done, aerr := r.abandonOnDelete(ctx, nm, "instance "+nm.Spec.InstanceID, err); done || aerr != nil {
				return reconcile.Result{}, aerr
			}
			setCond(nm, ConditionReady, metav1.ConditionFalse, ReasonShardUnreachable, err.Error())
			return reconcile.Result{RequeueAfter: r.poll()}, nil
		}
		resp, err := cl.GetInstanceStatus(ctx, &nstancev1.GetInstanceStatusRequest{Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: nm.Spec.InstanceID}})
		switch {
		case status.Code(err) == codes.NotFound:
			gone = true
		case err != nil:
			if done, aerr := r.abandonOnDelete(ctx, nm, "instance "+nm.Spec.InstanceID, err); done || aerr != nil {
				return reconcile.Result{}, aerr
			}
			setCond(nm, ConditionReady, metav1.ConditionFalse, ReasonShardUnreachable, status.Convert(err).Message())
			return reconcile.Result{RequeueAfter: r.poll()}, nil
		default:
			if st := resp.GetInstance().GetState(); st != nstancev1.InstanceState_INSTANCE_STATE_DELETING {
				skipDrain, err := r.drainedByCAPI(ctx, nm)
				if err != nil {
					return reconcile.Result{}, err
				}
				// A pending deletion the server announced is drained by the
				// coordinator, unless Cluster API drained the Node already:
				// skip_drain then lets the server go ahead.
				if st != nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION || skipDrain {
					if _, err := cl.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: nm.Spec.InstanceID, SkipDrain: skipDrain}); err != nil && status.Code(err) != codes.NotFound {
						return reconcile.Result{}, fmt.Errorf("DeleteInstance %s on shard %s: %w", nm.Spec.InstanceID, nm.Spec.Shard, err)
					}
				}
			}
			nm.Status.Ready = false
			nm.Status.State = stateName(resp.GetInstance().GetState())
			setCond(nm, ConditionReady, metav1.ConditionFalse, ReasonDeleting, "waiting for instance "+nm.Spec.InstanceID+" to be deleted")
		}
	}
	if !gone {
		return reconcile.Result{RequeueAfter: r.poll()}, nil
	}
	// The deferred patch removes it; the object may then be gone at once.
	controllerutil.RemoveFinalizer(nm, Finalizer)
	return reconcile.Result{}, nil
}

// abandonOnDelete releases the finalizer of a deleted NstanceMachine whose
// shard cannot be reached (cause) or is no longer configured, when its
// Cluster carries the abandon annotation: a Warning Event names what is
// left behind on which shard. done is false when nothing was abandoned
// (the caller waits as before).
func (r *Reconciler) abandonOnDelete(ctx context.Context, nm *infrav1.NstanceMachine, what string, cause error) (done bool, err error) {
	if r.Conns.Known(nm.Spec.Shard) && r.Conns.Healthy(nm.Spec.Shard) && !errors.Is(cause, shardconn.ErrUnknownShard) {
		switch status.Code(cause) {
		case codes.Unavailable, codes.DeadlineExceeded:
		default:
			return false, nil
		}
	}
	ok, err := abandon.Requested(ctx, r.Client, nm)
	if err != nil || !ok {
		return false, err
	}
	if r.Recorder != nil {
		r.Recorder.Eventf(nm, nil, corev1.EventTypeWarning, abandon.EventReason, "Delete",
			"shard %s cannot be reached (%s) and the Cluster carries %s: %s abandoned on shard %s (delete it there with nstance-admin once the shard is back)",
			nm.Spec.Shard, status.Convert(cause).Message(), infrav1.AbandonInstancesAnnotation, what, nm.Spec.Shard)
	}
	log.FromContext(ctx).Info("abandoned the instance of a deleted NstanceMachine", "shard", nm.Spec.Shard, "what", what)
	// The deferred patch removes it; the object may then be gone at once.
	controllerutil.RemoveFinalizer(nm, Finalizer)
	return true, nil
}

// lookupByToken returns the instance created with nm's create token on its
// shard, or "" when there is none.
func (r *Reconciler) lookupByToken(ctx context.Context, nm *infrav1.NstanceMachine) (string, error) {
	if !r.Conns.Known(nm.Spec.Shard) {
		return "", nil
	}
	cl, err := r.Conns.Client(nm.Spec.Shard)
	if err != nil {
		return "", err
	}
	resp, err := cl.GetInstanceStatus(ctx, &nstancev1.GetInstanceStatusRequest{Lookup: &nstancev1.GetInstanceStatusRequest_ClientToken{ClientToken: CreateToken(nm)}})
	if status.Code(err) == codes.NotFound {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("look up instance by create token on shard %s: %s", nm.Spec.Shard, status.Convert(err).Message())
	}
	return resp.GetInstance().GetInstanceId(), nil
}

func stateName(s nstancev1.InstanceState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "INSTANCE_STATE_"))
}

func addresses(in []*nstancev1.InstanceAddress) []infrav1.MachineAddress {
	var out []infrav1.MachineAddress
	for _, a := range in {
		var t infrav1.MachineAddressType
		switch a.GetType() {
		case nstancev1.AddressType_ADDRESS_TYPE_INTERNAL_IP:
			t = infrav1.MachineInternalIP
		case nstancev1.AddressType_ADDRESS_TYPE_EXTERNAL_IP:
			t = infrav1.MachineExternalIP
		case nstancev1.AddressType_ADDRESS_TYPE_INTERNAL_DNS:
			t = infrav1.MachineInternalDNS
		case nstancev1.AddressType_ADDRESS_TYPE_EXTERNAL_DNS:
			t = infrav1.MachineExternalDNS
		case nstancev1.AddressType_ADDRESS_TYPE_HOSTNAME:
			t = infrav1.MachineHostName
		default:
			continue
		}
		if a.GetAddress() != "" && len(out) < 32 {
			out = append(out, infrav1.MachineAddress{Type: t, Address: a.GetAddress()})
		}
	}
	return out
}
