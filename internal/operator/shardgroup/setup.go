package shardgroup

import (
	"context"
	"fmt"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/paused"
)

// SetupWithManager registers the controller. trigger carries shard groups to
// reconcile on behalf of the watch streams and shard health changes; it is
// read by the controller, so senders block rather than lose a request.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager, trigger <-chan event.GenericEvent, workers int) error {
	if workers <= 0 {
		workers = 4
	}
	b := ctrl.NewControllerManagedBy(mgr).
		Named("nstanceshardgroup").
		For(&infrav1.NstanceShardGroup{}, r.WatchFilter.For(mgr.GetScheme(), mgr.GetLogger())).
		WatchesRawSource(source.Channel(trigger, &handler.EnqueueRequestForObject{})).
		WithOptions(controller.Options{MaxConcurrentReconciles: workers})
	b, err := paused.WatchClusters(b, mgr, &infrav1.NstanceShardGroupList{}, mgr.GetLogger())
	if err != nil {
		return err
	}
	return b.Complete(r)
}

// Trigger sends a reconcile request for the shard group of group on shard.
func Trigger(ctx context.Context, ch chan<- event.GenericEvent, namespace, group, shard string) {
	sg := &infrav1.NstanceShardGroup{}
	sg.Namespace, sg.Name = namespace, infrav1.ShardGroupName(group, shard)
	select {
	case ch <- event.GenericEvent{Object: sg}:
	case <-ctx.Done():
	}
}

// TriggerShard requests a reconcile of every shard group on shard in
// namespace (empty: every namespace).
func TriggerShard(ctx context.Context, c client.Reader, ch chan<- event.GenericEvent, namespace, shard string) error {
	var list infrav1.NstanceShardGroupList
	if err := c.List(ctx, &list, client.InNamespace(namespace), client.MatchingLabels{infrav1.ShardLabel: shard}); err != nil {
		return fmt.Errorf("list shard groups of shard %s: %w", shard, err)
	}
	for i := range list.Items {
		Trigger(ctx, ch, list.Items[i].Namespace, list.Items[i].Spec.Group, shard)
	}
	return nil
}
