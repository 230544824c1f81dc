package ondemand

import (
	"cmp"
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/workload"
)

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machines,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachines,verbs=get;list;watch;create;delete

// Pod annotations and the bookkeeping the controller adds.
const (
	// AnnotationGroup names the Nstance group the pod's instance is created in.
	AnnotationGroup = "on-demand.nstance.dev/group"
	// AnnotationInstanceType optionally overrides the group's instance type.
	AnnotationInstanceType = "on-demand.nstance.dev/instance-type"
	// AnnotationShard optionally picks the shard; default: the first configured shard.
	AnnotationShard = "on-demand.nstance.dev/shard"
	// Finalizer on the pod: its Machine and NstanceMachine are deleted
	// before the pod goes (they may live in another namespace, where an
	// owner reference to the pod would not count).
	Finalizer = "on-demand.nstance.dev/cleanup"
	// Labels on the Machine and NstanceMachine naming the pod.
	LabelPodNamespace = "on-demand.nstance.dev/pod-namespace"
	LabelPodName      = "on-demand.nstance.dev/pod-name"
	// ReasonCreated is the Event reason on the pod.
	ReasonCreated = "OnDemandMachineCreated"
)

// Reconciler reconciles annotated pods.
type Reconciler struct {
	// Client writes Machines and NstanceMachines (the operator's cluster).
	Client client.Client
	// Workload is where the pods are: the workload cluster of the Cluster
	// Namespace/ClusterName (Pods are read and updated, and their Events
	// recorded, there).
	Workload workload.Access
	// Namespace holds the Cluster, Machines and NstanceMachines.
	Namespace    string
	ClusterName  string
	DefaultShard string
}

// Name returns the name of the Machine and NstanceMachine of a pod.
func Name(pod *corev1.Pod) string { return "od-" + string(pod.UID) }

func interesting(o client.Object) bool {
	_, annotated := o.GetAnnotations()[AnnotationGroup]
	return annotated || controllerutil.ContainsFinalizer(o, Finalizer)
}

func (r *Reconciler) cluster() client.ObjectKey {
	return client.ObjectKey{Namespace: r.Namespace, Name: r.ClusterName}
}

// SetupWithManager registers the controller; Pods are watched in the
// workload cluster (in-cluster: the manager's cache must cover Pods of every
// namespace).
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, workers int) error {
	// controller.New rather than the builder: the builder wants a watch
	// up front, and in management mode the Pod watch starts only once the
	// workload cluster is connected.
	c, err := controller.New("ondemand", mgr, controller.Options{Reconciler: r, MaxConcurrentReconciles: cmp.Or(workers, 4)})
	if err != nil {
		return fmt.Errorf("create on-demand controller: %w", err)
	}
	return r.Workload.Watch(r.cluster(), c, "ondemand-pods", &corev1.Pod{}, &handler.EnqueueRequestForObject{},
		predicate.NewPredicateFuncs(interesting))
}

// Reconcile ensures the Machine pair of one pod, or removes it.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	wl, err := r.Workload.Cluster(ctx, r.cluster())
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("pod %s: %w", req.NamespacedName, err)
	}
	var pod corev1.Pod
	if err := wl.Client.Get(ctx, req.NamespacedName, &pod); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	// While the Cluster is paused (clusterctl move) nothing is created or
	// removed; the pod is looked at again shortly.
	if p, err := r.clusterPaused(ctx); err != nil {
		return reconcile.Result{}, err
	} else if p {
		return reconcile.Result{RequeueAfter: pausePoll}, nil
	}
	group := pod.Annotations[AnnotationGroup]
	if !pod.DeletionTimestamp.IsZero() || group == "" {
		return reconcile.Result{}, r.remove(ctx, wl, &pod)
	}
	if controllerutil.AddFinalizer(&pod, Finalizer) {
		if err := wl.Client.Update(ctx, &pod); err != nil {
			return reconcile.Result{}, fmt.Errorf("add finalizer to pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
	}
	name := Name(&pod)
	shard := cmp.Or(pod.Annotations[AnnotationShard], r.DefaultShard)
	labels := map[string]string{clusterv1.ClusterNameLabel: r.ClusterName, LabelPodNamespace: pod.Namespace, LabelPodName: pod.Name}
	var owners []metav1.OwnerReference
	if wl.Local && pod.Namespace == r.Namespace {
		// Only a pod of the same cluster can own them; in management mode
		// the garbage collector would take a pod of the workload cluster
		// for a missing owner.
		owners = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}}
	}
	nm := &infrav1.NstanceMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: name, Labels: labels, OwnerReferences: owners},
		Spec:       infrav1.NstanceMachineSpec{Group: group, InstanceType: pod.Annotations[AnnotationInstanceType], Shard: shard},
	}
	created := false
	if err := r.Client.Create(ctx, nm); err == nil {
		created = true
	} else if !apierrors.IsAlreadyExists(err) {
		return reconcile.Result{}, fmt.Errorf("create NstanceMachine %s for pod %s/%s: %w", name, pod.Namespace, pod.Name, err)
	}
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: name, Labels: labels, OwnerReferences: owners},
		Spec: clusterv1.MachineSpec{
			ClusterName:   r.ClusterName,
			Bootstrap:     clusterv1.Bootstrap{DataSecretName: ptr.To("")},
			FailureDomain: shard,
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceMachine", Name: name,
			},
		},
	}
	if err := r.Client.Create(ctx, m); err != nil && !apierrors.IsAlreadyExists(err) {
		return reconcile.Result{}, fmt.Errorf("create Machine %s for pod %s/%s: %w", name, pod.Namespace, pod.Name, err)
	}
	if created && wl.Recorder != nil {
		wl.Recorder.Eventf(&pod, corev1.EventTypeNormal, ReasonCreated,
			"Machine and NstanceMachine %s/%s for group %s on shard %s", r.Namespace, name, group, shard)
	}
	return reconcile.Result{}, nil
}

// remove deletes the pod's Machine and NstanceMachine, then lets the pod go.
func (r *Reconciler) remove(ctx context.Context, wl *workload.Cluster, pod *corev1.Pod) error {
	if !controllerutil.ContainsFinalizer(pod, Finalizer) {
		return nil
	}
	name := Name(pod)
	for _, o := range []client.Object{
		&clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: name}},
		&infrav1.NstanceMachine{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: name}},
	} {
		if err := r.Client.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete %T %s: %w", o, name, err)
		}
	}
	controllerutil.RemoveFinalizer(pod, Finalizer)
	if err := wl.Client.Update(ctx, pod); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove finalizer from pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}
