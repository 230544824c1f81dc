package machinepool

import (
	"context"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/paused"
)

// SetupWithManager registers the index and the controller.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager, workers int) error {
	if workers <= 0 {
		workers = 4
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &clusterv1.MachinePool{}, InfraRefIndex, InfraRefName); err != nil {
		return err
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("nstancemachinepool").
		For(&infrav1.NstanceMachinePool{}, r.WatchFilter.For(mgr.GetScheme(), mgr.GetLogger())).
		Owns(&infrav1.NstanceShardGroup{}).
		// Not Owns: the pool owns its NstanceMachines without controlling
		// them (core CAPI's Machine does).
		Watches(&infrav1.NstanceMachine{}, handler.EnqueueRequestForOwner(mgr.GetScheme(), mgr.GetRESTMapper(), &infrav1.NstanceMachinePool{})).
		Watches(&clusterv1.MachinePool{}, handler.EnqueueRequestsFromMapFunc(mapMachinePool)).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers})
	b, err := paused.WatchClusters(b, mgr, &infrav1.NstanceMachinePoolList{}, mgr.GetLogger())
	if err != nil {
		return err
	}
	return b.Complete(r)
}

// mapMachinePool turns a MachinePool event into a request for the
// NstanceMachinePool its infrastructureRef names.
func mapMachinePool(_ context.Context, o client.Object) []reconcile.Request {
	names := InfraRefName(o)
	out := make([]reconcile.Request, 0, len(names))
	for _, n := range names {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: n}})
	}
	return out
}
