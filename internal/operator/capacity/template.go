package capacity

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/cluster-api/util/patch"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/watchfilter"
)

// RetryAfter is how soon a template whose capacity no shard answered is
// tried again.
const RetryAfter = time.Minute

// TemplateReconciler keeps NstanceMachineTemplate status.capacity and
// status.nodeInfo current. Nothing else writes a template's status.
type TemplateReconciler struct {
	// WatchFilter restricts the controller to objects labelled with it
	// (--watch-filter); empty means every object.
	WatchFilter watchfilter.Filter
	Client      client.Client
	Catalog     *Catalog
	// Shards are the shards asked for a template that names none.
	Shards []string
}

// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachinetemplates,verbs=get;list;watch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachinetemplates/status,verbs=get;update;patch

// Reconcile implements reconcile.Reconciler. It refreshes the status every
// catalog TTL, so a changed catalog entry reaches the template.
func (r *TemplateReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	t := &infrav1.NstanceMachineTemplate{}
	if err := r.Client.Get(ctx, req.NamespacedName, t); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("get NstanceMachineTemplate %s: %w", req.NamespacedName, err)
	}
	if !r.WatchFilter.Matches(t) {
		return ctrl.Result{}, nil // another operator's (--watch-filter)
	}
	if !t.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, nil
	}
	helper, err := patch.NewHelper(t, r.Client)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("patch helper for NstanceMachineTemplate %s: %w", req.NamespacedName, err)
	}
	defer func() {
		if err := helper.Patch(ctx, t); err != nil && retErr == nil {
			retErr = fmt.Errorf("patch NstanceMachineTemplate %s status: %w", req.NamespacedName, err)
		}
	}()
	if err := SetTemplate(ctx, r.Catalog, t, r.Shards); err != nil {
		ctrl.LoggerFrom(ctx).Info("template capacity not published", "error", err.Error())
		return ctrl.Result{RequeueAfter: RetryAfter}, nil
	}
	ttl := r.Catalog.TTL
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	return ctrl.Result{RequeueAfter: ttl}, nil
}

// SetupWithManager registers the controller.
func (r *TemplateReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("nstancemachinetemplate").
		For(&infrav1.NstanceMachineTemplate{}, r.WatchFilter.For(mgr.GetScheme(), mgr.GetLogger())).
		Complete(r)
}
