package machine

import (
	"context"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

// drainedByCAPI reports whether core Cluster API already took care of the
// Node of nm's instance: nm's Machine is being deleted and CAPI started
// draining it (status.deletion.nodeDrainStartTime) or was told not to
// (the exclude-node-draining annotation). CAPI deletes the NstanceMachine
// only after that, so the instance is then deleted with skip_drain and the
// server announces no drain for the coordinator to repeat. When CAPI did
// not drain (a Cluster without a control plane, a Machine without a Node,
// an NstanceMachine deleted by hand), the server's drain runs as before.
//
// The Machine is read from the API server, not the cache: CAPI records the
// drain start on it just before deleting the NstanceMachine, and a stale
// cached copy would make the node drain twice.
func (r *Reconciler) drainedByCAPI(ctx context.Context, nm *infrav1.NstanceMachine) (bool, error) {
	reader := r.Reader
	if reader == nil {
		reader = r.Client
	}
	m, err := OwnerMachine(ctx, reader, nm)
	if err != nil || m == nil || m.DeletionTimestamp.IsZero() {
		return false, err
	}
	if _, ok := m.Annotations[clusterv1.ExcludeNodeDrainingAnnotation]; ok {
		return true, nil
	}
	return m.Status.Deletion != nil && !m.Status.Deletion.NodeDrainStartTime.IsZero(), nil
}
