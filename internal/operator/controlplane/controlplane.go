package controlplane

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/finalizers"
	"sigs.k8s.io/cluster-api/util/patch"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	cpv1 "github.com/nstance-dev/nstance/api/controlplane/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/paused"
	"github.com/nstance-dev/nstance/internal/operator/watchfilter"
)

// Reconciler reconciles NstanceControlPlanes.
type Reconciler struct {
	// WatchFilter restricts the controller to objects labelled with it
	// (--watch-filter); empty means every object.
	WatchFilter watchfilter.Filter
	Client      client.Client
	// ManageKubeconfig is false when NSTANCE_CAPI_ENDPOINT is set: the
	// kubeconfig Secret is then the user's, and only observed.
	ManageKubeconfig bool
	// ServiceAccount whose tokens go into the kubeconfig.
	ServiceAccount string
	// APIServer is where the kubeconfig points (the API server the operator
	// itself uses) and CAData its CA.
	APIServer string
	CAData    []byte
	// TokenTTL is the requested token lifetime; zero means 24h. Tokens are
	// re-requested once two thirds of it has passed.
	TokenTTL time.Duration
	Now      func() time.Time
}

// +kubebuilder:rbac:groups=controlplane.cluster.x-k8s.io,resources=nstancecontrolplanes,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=controlplane.cluster.x-k8s.io,resources=nstancecontrolplanes/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=controlplane.cluster.x-k8s.io,resources=nstancecontrolplanes/finalizers,verbs=update
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters,verbs=get;list;watch
// +kubebuilder:rbac:groups="",namespace=nstance-system,resources=secrets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=nstance-system,resources=serviceaccounts,verbs=create
// +kubebuilder:rbac:groups="",namespace=nstance-system,resources=serviceaccounts/token,verbs=create

func (r *Reconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Reconciler) ttl() time.Duration {
	if r.TokenTTL > 0 {
		return r.TokenTTL
	}
	return 24 * time.Hour
}

// SetupWithManager registers the controller. Kubeconfig Secrets and
// Clusters (pause, controlPlaneRef) bring their control plane back.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("nstancecontrolplane").
		For(&cpv1.NstanceControlPlane{}, r.WatchFilter.For(mgr.GetScheme(), mgr.GetLogger())).
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(r.secretToControlPlanes)).
		Watches(&clusterv1.Cluster{}, handler.EnqueueRequestsFromMapFunc(r.clusterToControlPlanes)).
		Complete(r)
}

// ClusterName is the Cluster a control plane belongs to: its owner (set by
// core Cluster API), else its cluster-name label.
func ClusterName(cp *cpv1.NstanceControlPlane) string {
	for _, ref := range cp.OwnerReferences {
		if ref.Kind == "Cluster" && strings.HasPrefix(ref.APIVersion, clusterv1.GroupVersion.Group+"/") {
			return ref.Name
		}
	}
	return cp.Labels[clusterv1.ClusterNameLabel]
}

// controlPlanesOf lists the control planes of the Cluster named cluster.
func (r *Reconciler) controlPlanesOf(ctx context.Context, namespace, cluster string) []reconcile.Request {
	if cluster == "" {
		return nil
	}
	var list cpv1.NstanceControlPlaneList
	if err := r.Client.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "list NstanceControlPlanes", "namespace", namespace)
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		if ClusterName(&list.Items[i]) == cluster {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&list.Items[i])})
		}
	}
	return out
}

func (r *Reconciler) secretToControlPlanes(ctx context.Context, o client.Object) []reconcile.Request {
	cluster, ok := strings.CutSuffix(o.GetName(), "-kubeconfig")
	if !ok {
		return nil
	}
	if l := o.GetLabels()[clusterv1.ClusterNameLabel]; l != "" {
		cluster = l
	}
	return r.controlPlanesOf(ctx, o.GetNamespace(), cluster)
}

func (r *Reconciler) clusterToControlPlanes(ctx context.Context, o client.Object) []reconcile.Request {
	return r.controlPlanesOf(ctx, o.GetNamespace(), o.GetName())
}

// cluster returns the control plane's Cluster, or nil when it does not
// exist (yet).
func (r *Reconciler) cluster(ctx context.Context, cp *cpv1.NstanceControlPlane) (*clusterv1.Cluster, error) {
	name := ClusterName(cp)
	if name == "" {
		return nil, nil
	}
	var c clusterv1.Cluster
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: cp.Namespace, Name: name}, &c); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("get Cluster %s: %w", name, err)
	}
	return &c, nil
}

// Reconcile implements reconcile.Reconciler.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, reterr error) {
	log := ctrl.LoggerFrom(ctx)
	cp := &cpv1.NstanceControlPlane{}
	if err := r.Client.Get(ctx, req.NamespacedName, cp); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !r.WatchFilter.Matches(cp) {
		return ctrl.Result{}, nil // another operator's (--watch-filter)
	}
	cluster, err := r.cluster(ctx, cp)
	if err != nil {
		return ctrl.Result{}, err
	}
	if cluster == nil && cp.DeletionTimestamp.IsZero() {
		// The Cluster watch brings us back once it exists.
		log.Info("waiting for the Cluster", "cluster", ClusterName(cp))
		return ctrl.Result{}, nil
	}
	if cluster != nil {
		log = log.WithValues("Cluster", cluster.Name)
		ctx = ctrl.LoggerInto(ctx, log)
	}
	if stop, err := paused.EnsureCondition(ctx, r.Client, cluster, cp); err != nil || stop {
		return ctrl.Result{}, err
	}
	// After the pause check: a paused control plane is not written to.
	if added, err := finalizers.EnsureFinalizer(ctx, r.Client, cp, cpv1.ControlPlaneFinalizer); err != nil || added {
		return ctrl.Result{}, err
	}
	helper, err := patch.NewHelper(cp, r.Client)
	if err != nil {
		return ctrl.Result{}, err
	}
	defer func() {
		if err := helper.Patch(ctx, cp, patch.WithOwnedConditions{Conditions: []string{
			clusterv1.PausedCondition, cpv1.AvailableCondition, cpv1.ReadyCondition,
		}}); err != nil {
			reterr = kerrors.NewAggregate([]error{reterr, err})
		}
	}()
	if !cp.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.reconcileDelete(ctx, cp, cluster)
	}
	return r.reconcileNormal(ctx, cp, cluster)
}

func (r *Reconciler) reconcileNormal(ctx context.Context, cp *cpv1.NstanceControlPlane, cluster *clusterv1.Cluster) (ctrl.Result, error) {
	cp.Status.ObservedGeneration = cp.Generation
	cp.Status.ExternalManagedControlPlane = ptr.To(true)
	if ref := cluster.Spec.ControlPlaneRef; ref.IsDefined() &&
		(ref.APIGroup != cpv1.GroupVersion.Group || ref.Kind != "NstanceControlPlane" || ref.Name != cp.Name) {
		// Another control plane provider owns this Cluster's kubeconfig.
		msg := fmt.Sprintf("Cluster %s uses %s %s as its control plane", cluster.Name, ref.Kind, ref.Name)
		r.setConditions(cp, metav1.ConditionFalse, cpv1.NotReferencedReason, msg, metav1.ConditionFalse, cpv1.NotReferencedReason, msg)
		return ctrl.Result{}, nil
	}

	var (
		secret  *corev1.Secret
		next    time.Duration
		failure error
	)
	if r.ManageKubeconfig {
		secret, next, failure = r.ensureKubeconfig(ctx, cp, cluster.Name)
	}
	if secret == nil {
		var s corev1.Secret
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: cp.Namespace, Name: KubeconfigSecretName(cluster.Name)}, &s)
		switch {
		case err == nil:
			secret = &s
		case !apierrors.IsNotFound(err):
			return ctrl.Result{}, kerrors.NewAggregate([]error{failure, fmt.Errorf("get kubeconfig Secret: %w", err)})
		}
	}

	name := KubeconfigSecretName(cluster.Name)
	if secret == nil || len(secret.Data["value"]) == 0 {
		msg := fmt.Sprintf("Secret %s does not exist", name)
		if secret != nil {
			msg = fmt.Sprintf("Secret %s holds no kubeconfig under \"value\"", name)
		}
		readyReason, readyMsg := cpv1.WaitingForKubeconfigReason, msg
		if failure != nil {
			readyReason, readyMsg = cpv1.KubeconfigRefreshFailedReason, failure.Error()
		}
		r.setConditions(cp, metav1.ConditionFalse, cpv1.WaitingForKubeconfigReason, msg, metav1.ConditionFalse, readyReason, readyMsg)
		return ctrl.Result{}, failure
	}
	// Initialized latches: a Secret deleted later makes the control plane
	// unavailable, not uninitialized.
	cp.Status.Initialization.ControlPlaneInitialized = ptr.To(true)
	if failure != nil {
		// The last kubeconfig still works until its token expires.
		r.setConditions(cp, metav1.ConditionTrue, cpv1.KubeconfigAvailableReason, "",
			metav1.ConditionFalse, cpv1.KubeconfigRefreshFailedReason, failure.Error())
		return ctrl.Result{}, failure
	}
	r.setConditions(cp, metav1.ConditionTrue, cpv1.KubeconfigAvailableReason, "", metav1.ConditionTrue, cpv1.KubeconfigAvailableReason, "")
	return ctrl.Result{RequeueAfter: next}, nil
}

// reconcileDelete removes the kubeconfig Secret the control plane manages
// (its token stays valid until it expires, but nothing hands it out any
// more), then the finalizer.
func (r *Reconciler) reconcileDelete(ctx context.Context, cp *cpv1.NstanceControlPlane, cluster *clusterv1.Cluster) error {
	msg := "deleting the kubeconfig Secret"
	r.setConditions(cp, metav1.ConditionFalse, cpv1.DeletingReason, msg, metav1.ConditionFalse, cpv1.DeletingReason, msg)
	name := ClusterName(cp)
	if cluster != nil {
		name = cluster.Name
	}
	if name != "" {
		var s corev1.Secret
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: cp.Namespace, Name: KubeconfigSecretName(name)}, &s)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return fmt.Errorf("get kubeconfig Secret: %w", err)
		case metav1.IsControlledBy(&s, cp):
			if err := r.Client.Delete(ctx, &s, client.Preconditions{UID: &s.UID}); err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete kubeconfig Secret %s: %w", s.Name, err)
			}
		}
	}
	controllerutil.RemoveFinalizer(cp, cpv1.ControlPlaneFinalizer)
	return nil
}

func (r *Reconciler) setConditions(cp *cpv1.NstanceControlPlane, avail metav1.ConditionStatus, availReason, availMsg string,
	ready metav1.ConditionStatus, readyReason, readyMsg string) {
	conditions.Set(cp, metav1.Condition{Type: cpv1.AvailableCondition, Status: avail, Reason: availReason, Message: availMsg,
		ObservedGeneration: cp.Generation})
	conditions.Set(cp, metav1.Condition{Type: cpv1.ReadyCondition, Status: ready, Reason: readyReason, Message: readyMsg,
		ObservedGeneration: cp.Generation})
}
