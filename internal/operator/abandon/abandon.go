// Package abandon decides when a deletion may leave instances behind on a
// shard it cannot reach: only when the admin asked for it on the Cluster
// (infrav1.AbandonInstancesAnnotation) and only for shards that cannot be
// reached or are no longer configured.
package abandon

import (
	"context"
	"fmt"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/paused"
)

// EventReason is the reason of the Warning Event naming what a released
// finalizer left behind.
const EventReason = "InstancesAbandoned"

// Requested reports whether obj's Cluster (its cluster-name label) carries
// the abandon annotation set to "true". An object without a Cluster never
// abandons anything.
func Requested(ctx context.Context, r client.Reader, obj client.Object) (bool, error) {
	cl, err := paused.Cluster(ctx, r, obj)
	if err != nil {
		return false, fmt.Errorf("abandon annotation of the Cluster of %s: %w", obj.GetName(), err)
	}
	return cl != nil && Annotated(cl), nil
}

// Annotated reports whether obj carries the abandon annotation set to "true".
func Annotated(obj client.Object) bool {
	return strings.EqualFold(obj.GetAnnotations()[infrav1.AbandonInstancesAnnotation], "true")
}
