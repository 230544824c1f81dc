package ondemand

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"

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
	"github.com/nstance-dev/nstance/internal/operator/watchfilter"
	"github.com/nstance-dev/nstance/internal/operator/workload"
)

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=machines,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachines,verbs=get;list;watch;create;delete
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachinepools,verbs=get;list;watch

// Pod annotations and the bookkeeping the controller adds.
const (
	// AnnotationGroup names the Nstance group the pod's instance is created in.
	AnnotationGroup = "on-demand.nstance.dev/group"
	// AnnotationInstanceType optionally overrides the group's instance
	// type, with one its pool allows (Decide).
	AnnotationInstanceType = "on-demand.nstance.dev/instance-type"
	// AnnotationShard optionally picks one of the pool's shards; default:
	// the pool's first.
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
	// ReasonRefused is the reason of the Warning Event on a pod whose
	// request the rules refuse (Decide); its message names the rule.
	ReasonRefused = "OnDemandRefused"
	// DefaultRecheck is how often a refused pod is looked at again (its
	// pool may have opted in, or an on-demand instance gone since).
	DefaultRecheck = time.Minute
)

// Reconciler reconciles annotated pods.
type Reconciler struct {
	// WatchFilter (--watch-filter) labels the objects the controller creates.
	WatchFilter watchfilter.Filter
	// Client writes Machines and NstanceMachines (the operator's cluster).
	Client client.Client
	// Workload is where the pods are: the workload cluster of the Cluster
	// Namespace/ClusterName (Pods are read and updated, and their Events
	// recorded, there).
	Workload workload.Access
	// Reader counts the existing on-demand NstanceMachines uncached, so a
	// pod just admitted counts for the next one; nil means Client.
	Reader client.Reader
	// Namespace holds the Cluster, pools, Machines and NstanceMachines.
	Namespace   string
	ClusterName string
	// Namespaces may hold on-demand pods (the operator's
	// on_demand_namespaces); empty means Namespace only.
	Namespaces []string
	// Recheck is how often a refused pod is looked at again; zero means
	// DefaultRecheck. A pod of a namespace that is not allowed is not.
	Recheck time.Duration
	Log     logr.Logger

	// admit serialises counting and creating, so concurrent workers never
	// admit more than a pool's maxInstances between them.
	admit sync.Mutex
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
	name := Name(&pod)
	// A pod admitted before keeps its pair; its annotations are not looked
	// at again (the NstanceMachine holds what was admitted).
	var existing infrav1.NstanceMachine
	err = r.Client.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, &existing)
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, fmt.Errorf("get NstanceMachine %s for pod %s/%s: %w", name, pod.Namespace, pod.Name, err)
	}
	if err == nil {
		return reconcile.Result{}, r.ensure(ctx, wl, &pod, existing.Spec.Group, existing.Spec.InstanceType, existing.Spec.Shard)
	}
	r.admit.Lock()
	defer r.admit.Unlock()
	d, err := r.decide(ctx, &pod)
	if err != nil {
		return reconcile.Result{}, err
	}
	if d.Refused != "" {
		r.Log.Info("on-demand pod refused", "pod", client.ObjectKeyFromObject(&pod), "group", group, "rule", d.Refused, "reason", d.Message)
		if wl.Recorder != nil {
			wl.Recorder.Event(&pod, corev1.EventTypeWarning, ReasonRefused, d.Message)
		}
		if d.Refused == RefusedNamespace {
			// Only a new operator setting changes that (and a restart
			// looks at every pod again).
			return reconcile.Result{}, nil
		}
		return reconcile.Result{RequeueAfter: cmp.Or(r.Recheck, DefaultRecheck)}, nil
	}
	return reconcile.Result{}, r.ensure(ctx, wl, &pod, group, d.InstanceType, d.Shard)
}

// decide applies Decide to pod, reading the pools and counting the group's
// on-demand NstanceMachines.
func (r *Reconciler) decide(ctx context.Context, pod *corev1.Pod) (Decision, error) {
	req := Request{Namespace: pod.Namespace, Group: pod.Annotations[AnnotationGroup],
		InstanceType: pod.Annotations[AnnotationInstanceType], Shard: pod.Annotations[AnnotationShard]}
	policy := Policy{Namespaces: r.Namespaces, OperatorNamespace: r.Namespace}
	if !policy.NamespaceAllowed(req.Namespace) {
		return Decide(policy, req, nil, 0), nil // nothing else is read for it
	}
	var pools infrav1.NstanceMachinePoolList
	if err := r.Client.List(ctx, &pools, client.InNamespace(r.Namespace)); err != nil {
		return Decision{}, fmt.Errorf("list NstanceMachinePools for pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	reader := r.Reader
	if reader == nil {
		reader = r.Client
	}
	var nms infrav1.NstanceMachineList
	if err := reader.List(ctx, &nms, client.InNamespace(r.Namespace), client.HasLabels{LabelPodName},
		client.MatchingLabels{clusterv1.ClusterNameLabel: r.ClusterName}); err != nil {
		return Decision{}, fmt.Errorf("list on-demand NstanceMachines for pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	count := 0
	for _, nm := range nms.Items {
		if nm.Spec.Group == req.Group && nm.Name != Name(pod) {
			count++
		}
	}
	return Decide(policy, req, pools.Items, count), nil
}

// ensure creates the pod's Machine and NstanceMachine (whichever is
// missing), after the pod's finalizer.
func (r *Reconciler) ensure(ctx context.Context, wl *workload.Cluster, pod *corev1.Pod, group, instanceType, shard string) error {
	if controllerutil.AddFinalizer(pod, Finalizer) {
		if err := wl.Client.Update(ctx, pod); err != nil {
			return fmt.Errorf("add finalizer to pod %s/%s: %w", pod.Namespace, pod.Name, err)
		}
	}
	name := Name(pod)
	labels := map[string]string{clusterv1.ClusterNameLabel: r.ClusterName, LabelPodNamespace: pod.Namespace, LabelPodName: pod.Name}
	if r.WatchFilter != "" {
		labels[watchfilter.Label] = string(r.WatchFilter)
	}
	var owners []metav1.OwnerReference
	if wl.Local && pod.Namespace == r.Namespace {
		// Only a pod of the same cluster can own them; in management mode
		// the garbage collector would take a pod of the workload cluster
		// for a missing owner.
		owners = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}}
	}
	nm := &infrav1.NstanceMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: name, Labels: labels, OwnerReferences: owners},
		Spec:       infrav1.NstanceMachineSpec{Group: group, InstanceType: instanceType, Shard: shard},
	}
	created := false
	if err := r.Client.Create(ctx, nm); err == nil {
		created = true
	} else if !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create NstanceMachine %s for pod %s/%s: %w", name, pod.Namespace, pod.Name, err)
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
		return fmt.Errorf("create Machine %s for pod %s/%s: %w", name, pod.Namespace, pod.Name, err)
	}
	if created && wl.Recorder != nil {
		wl.Recorder.Eventf(pod, corev1.EventTypeNormal, ReasonCreated,
			"Machine and NstanceMachine %s/%s for group %s on shard %s", r.Namespace, name, group, shard)
	}
	return nil
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
