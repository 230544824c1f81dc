package ondemand

import (
	"context"
	"time"

	"github.com/nstance-dev/nstance/internal/operator/paused"
)

// pausePoll is how often a pod of a paused Cluster is looked at again.
const pausePoll = time.Second

// clusterPaused reports whether the operator's Cluster (Namespace,
// ClusterName, in the operator's own cluster) is paused.
func (r *Reconciler) clusterPaused(ctx context.Context) (bool, error) {
	cl, err := paused.ClusterNamed(ctx, r.Client, r.Namespace, r.ClusterName)
	if err != nil {
		return false, err
	}
	return paused.IsClusterPaused(cl), nil
}
