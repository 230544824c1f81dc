package rollguard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/paused"
	"github.com/nstance-dev/nstance/internal/operator/watchfilter"
	"github.com/nstance-dev/nstance/internal/operator/workload"
)

// RBAC: pools are read and annotated; workload Nodes patched (granted with the manager's).
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstancemachinepools,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch;patch

// DefaultRecheck is how often a rolling pool's Nodes are looked at again
// (new members join while it rolls).
const DefaultRecheck = 5 * time.Second

// Reconciler applies Plan to the Nodes of each NstanceMachinePool (those of
// spec.providerIDList, which core CAPI and the autoscaler read too).
type Reconciler struct {
	Client   client.Client
	Workload workload.Access
	// Cluster is the Cluster API Cluster whose workload cluster holds the
	// Nodes.
	Cluster client.ObjectKey
	// Recheck while rolling or while releasing failed; zero means
	// DefaultRecheck.
	Recheck time.Duration
	Log     logr.Logger
	// WatchFilter restricts the controller to pools labelled with it
	// (--watch-filter); empty means every pool.
	WatchFilter watchfilter.Filter
}

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr).Named("rollguard").
		For(&infrav1.NstanceMachinePool{}, r.WatchFilter.For(mgr.GetScheme(), mgr.GetLogger())).
		WithOptions(controller.Options{MaxConcurrentReconciles: 2})
	b, err := paused.WatchClusters(b, mgr, &infrav1.NstanceMachinePoolList{}, mgr.GetLogger())
	if err != nil {
		return err
	}
	return b.Complete(r)
}

// Reconcile disables autoscaler scale-down on the pool's Nodes while it
// rolls out, and releases what it set once it does not. A paused Cluster or
// pool stops it (what is set stays until the pass after the pause).
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var pool infrav1.NstanceMachinePool
	if err := r.Client.Get(ctx, req.NamespacedName, &pool); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !r.WatchFilter.Matches(&pool) {
		return ctrl.Result{}, nil // another operator's (--watch-filter)
	}
	if stop, err := paused.Check(ctx, r.Client, pool.Namespace, &pool); err != nil || stop {
		return ctrl.Result{}, err
	}
	recheck := cmp.Or(r.Recheck, DefaultRecheck)
	wl, err := r.Workload.Cluster(ctx, r.Cluster)
	if err != nil {
		r.Log.V(1).Info("workload cluster unreachable; scale-down guard waits", "pool", req.NamespacedName, "error", err.Error())
		return ctrl.Result{RequeueAfter: recheck}, nil
	}
	rolling := pool.DeletionTimestamp.IsZero() && conditions.IsTrue(&pool, infrav1.RollingOutCondition)
	_, held := pool.Annotations[HeldAnnotation]
	var nodes []*corev1.Node
	var errs []error
	for _, id := range pool.Spec.ProviderIDList {
		var list corev1.NodeList
		if err := wl.Client.List(ctx, &list, client.MatchingFields{workload.NodeProviderIDIndex: id}); err != nil {
			errs = append(errs, fmt.Errorf("list Nodes with providerID %s: %w", id, err))
			continue
		}
		for i := range list.Items {
			nodes = append(nodes, &list.Items[i])
		}
	}
	step := PlanPool(rolling, held, slices.ContainsFunc(nodes, func(n *corev1.Node) bool { return planFor(rolling, n) == Disable }))
	if step.Hold {
		if err := r.setHeld(ctx, &pool, true); err != nil {
			return ctrl.Result{}, err
		}
	}
	if step.ReadLive {
		// The rollout can end right after a member joined.
		for i, n := range nodes {
			var live corev1.Node
			if err := wl.Reader.Get(ctx, client.ObjectKeyFromObject(n), &live); err != nil {
				if !apierrors.IsNotFound(err) {
					errs = append(errs, fmt.Errorf("read Node %s: %w", n.Name, err))
				}
				nodes[i] = nil
				continue
			}
			nodes[i] = &live
		}
	}
	for _, n := range nodes {
		if n == nil {
			continue
		}
		if err := r.apply(ctx, wl, n, rolling); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return ctrl.Result{}, fmt.Errorf("pool %s scale-down guard: %w", req.NamespacedName, err)
	}
	if step.Unhold {
		if err := r.setHeld(ctx, &pool, false); err != nil {
			return ctrl.Result{}, err
		}
	}
	if rolling {
		return ctrl.Result{RequeueAfter: recheck}, nil
	}
	return ctrl.Result{}, nil
}

// setHeld adds or removes the pool's HeldAnnotation.
func (r *Reconciler) setHeld(ctx context.Context, pool *infrav1.NstanceMachinePool, held bool) error {
	orig := pool.DeepCopy()
	p := pool.DeepCopy()
	if held {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[HeldAnnotation] = "true"
	} else {
		delete(p.Annotations, HeldAnnotation)
	}
	if err := r.Client.Patch(ctx, p, client.MergeFrom(orig)); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("pool %s/%s: record scale-down guard held=%t: %w", pool.Namespace, pool.Name, held, err)
	}
	return nil
}

func planFor(rolling bool, n *corev1.Node) Action {
	v, has := n.Annotations[ScaleDownDisabledAnnotation]
	_, owned := n.Annotations[OwnedAnnotation]
	return Plan(rolling, Node{Name: n.Name, Disabled: v, HasDisabled: has, Owned: owned})
}

func (r *Reconciler) apply(ctx context.Context, wl *workload.Cluster, n *corev1.Node, rolling bool) error {
	// A Node changes often (its status, the label carry): a conflict is
	// answered at once with the Node read again from the API server, not
	// with the controller's growing backoff, which left a guard on for
	// a minute after a rollout.
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		act := planFor(rolling, n)
		if act == Keep {
			return nil
		}
		orig := n.DeepCopy()
		next := n.DeepCopy()
		switch act {
		case Disable:
			if next.Annotations == nil {
				next.Annotations = map[string]string{}
			}
			next.Annotations[ScaleDownDisabledAnnotation] = "true"
			next.Annotations[OwnedAnnotation] = "true"
		case Release:
			delete(next.Annotations, OwnedAnnotation)
			if next.Annotations[ScaleDownDisabledAnnotation] == "true" {
				delete(next.Annotations, ScaleDownDisabledAnnotation)
			}
		}
		// Optimistic locking: a user's annotation written since the read is
		// never overwritten or removed on a stale view.
		err := wl.Client.Patch(ctx, next, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case apierrors.IsConflict(err):
			var live corev1.Node
			if gerr := wl.Reader.Get(ctx, client.ObjectKeyFromObject(n), &live); gerr != nil {
				return client.IgnoreNotFound(gerr)
			}
			n = &live
			return err
		case err != nil:
			return fmt.Errorf("patch Node %s scale-down annotation: %w", n.Name, err)
		}
		r.Log.V(1).Info("autoscaler scale-down guard", "node", n.Name, "disabled", act == Disable)
		return nil
	})
}
