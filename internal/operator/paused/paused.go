package paused

import (
	"context"
	"fmt"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util"
	"sigs.k8s.io/cluster-api/util/annotations"
	"sigs.k8s.io/cluster-api/util/conditions"
	capipaused "sigs.k8s.io/cluster-api/util/paused"
	"sigs.k8s.io/cluster-api/util/predicates"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
)

// Cluster returns the Cluster named by obj's cluster-name label in its
// namespace, or nil when the label is missing or the Cluster does not exist.
func Cluster(ctx context.Context, r client.Reader, obj client.Object) (*clusterv1.Cluster, error) {
	name := obj.GetLabels()[clusterv1.ClusterNameLabel]
	if name == "" {
		return nil, nil
	}
	return ClusterNamed(ctx, r, obj.GetNamespace(), name)
}

// ClusterNamed returns the Cluster namespace/name, or nil when it does not
// exist.
func ClusterNamed(ctx context.Context, r client.Reader, namespace, name string) (*clusterv1.Cluster, error) {
	var c clusterv1.Cluster
	if err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &c); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("get Cluster %s/%s: %w", namespace, name, err)
	}
	return &c, nil
}

// IsClusterPaused reports whether c (which may be nil) is paused. As in
// Cluster API, only spec.paused pauses a Cluster; the paused annotation
// pauses the object that carries it.
func IsClusterPaused(c *clusterv1.Cluster) bool {
	return c != nil && ptr.Deref(c.Spec.Paused, false)
}

// Ensure sets obj's Paused condition from its Cluster (found by the
// cluster-name label) and its own paused annotation; see EnsureCondition.
// cluster is the object's Cluster, or nil.
func Ensure(ctx context.Context, c client.Client, obj capipaused.ConditionSetter) (cluster *clusterv1.Cluster, stop bool, err error) {
	cluster, err = Cluster(ctx, c, obj)
	if err != nil {
		return nil, true, err
	}
	stop, err = EnsureCondition(ctx, c, cluster, obj)
	return cluster, stop, err
}

// EnsureDeferred is Ensure for a reconciler that writes the object with a
// patch helper at the end of its pass. A paused object is handled as
// Ensure does (its condition written, stop true). For one that is not
// paused nothing is written here: the reconciler calls SetNotPaused once
// its patch helper exists, and the condition goes out with the pass's
// other changes. Cluster API's EnsurePausedCondition writes it at once and
// asks for a requeue, which costs every new object one more write and one
// more round trip through the watch (3,000 objects in a start-up import of
// 1,000 groups on two shards).
func EnsureDeferred(ctx context.Context, c client.Client, obj capipaused.ConditionSetter) (cluster *clusterv1.Cluster, stop bool, err error) {
	cluster, err = Cluster(ctx, c, obj)
	if err != nil {
		return nil, true, err
	}
	if IsClusterPaused(cluster) || annotations.HasPaused(obj) {
		stop, err = EnsureCondition(ctx, c, cluster, obj)
		return cluster, stop, err
	}
	return cluster, false, nil
}

// SetNotPaused sets obj's Paused condition to False (NotPaused) in memory,
// for the caller's patch helper to write (see EnsureDeferred).
func SetNotPaused(obj capipaused.ConditionSetter) {
	conditions.Set(obj, metav1.Condition{Type: clusterv1.PausedCondition, Status: metav1.ConditionFalse,
		Reason: clusterv1.NotPausedReason, ObservedGeneration: obj.GetGeneration()})
}

// EnsureCondition sets obj's Paused condition from cluster (nil: none) and
// obj's paused annotation, as Cluster API's EnsurePausedCondition does. A
// reconciler stops when stop is true: the object is paused, or the
// condition was just written (the write brings the object back).
func EnsureCondition(ctx context.Context, c client.Client, cluster *clusterv1.Cluster, obj capipaused.ConditionSetter) (stop bool, err error) {
	// Still paused and already saying so: nothing is written, not even the
	// condition's observedGeneration after a spec change (which
	// EnsurePausedCondition would patch), so a paused object sees no write.
	if (IsClusterPaused(cluster) || annotations.HasPaused(obj)) && conditions.IsTrue(obj, clusterv1.PausedCondition) {
		return true, nil
	}
	isPaused, requeue, err := capipaused.EnsurePausedCondition(ctx, c, cluster, obj)
	if err != nil {
		return true, fmt.Errorf("set Paused condition of %s: %w", obj.GetName(), err)
	}
	return isPaused || requeue, nil
}

// Check returns true when any object carries the paused annotation or the
// Cluster named by their cluster-name label (in namespace) is paused. Nil
// objects are skipped; a missing Cluster is not paused.
func Check(ctx context.Context, r client.Reader, namespace string, objs ...client.Object) (bool, error) {
	cluster := ""
	for _, o := range objs {
		if o == nil {
			continue
		}
		if _, ok := o.GetAnnotations()[clusterv1.PausedAnnotation]; ok {
			return true, nil
		}
		if n := o.GetLabels()[clusterv1.ClusterNameLabel]; n != "" && cluster == "" {
			cluster = n
		}
	}
	if cluster == "" {
		return false, nil
	}
	c, err := ClusterNamed(ctx, r, namespace, cluster)
	if err != nil {
		return false, err
	}
	return IsClusterPaused(c), nil
}

// WatchClusters makes b reconcile every object of list's kind that carries
// a Cluster's name label when that Cluster is paused or unpaused, so a
// resumed object is reconciled at once rather than at the next resync.
func WatchClusters(b *builder.Builder, mgr ctrl.Manager, list client.ObjectList, log logr.Logger) (*builder.Builder, error) {
	mapper, err := util.ClusterToTypedObjectsMapper(mgr.GetClient(), list, mgr.GetScheme())
	if err != nil {
		return nil, fmt.Errorf("map Clusters to %T: %w", list, err)
	}
	return b.Watches(&clusterv1.Cluster{}, handler.EnqueueRequestsFromMapFunc(mapper),
		builder.WithPredicates(predicates.ClusterPausedTransitions(mgr.GetScheme(), log))), nil
}
