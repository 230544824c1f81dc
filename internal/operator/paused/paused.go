package paused

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

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
	var c clusterv1.Cluster
	if err := r.Get(ctx, client.ObjectKey{Namespace: namespace, Name: cluster}, &c); err != nil {
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("get Cluster %s/%s: %w", namespace, cluster, err)
	}
	if _, ok := c.Annotations[clusterv1.PausedAnnotation]; ok {
		return true, nil
	}
	return c.Spec.Paused != nil && *c.Spec.Paused, nil
}
