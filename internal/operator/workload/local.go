package workload

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// Local is the InCluster access: every Cluster's workload cluster is the
// operator's own, read through the manager's cache (which must cover Pods of
// every namespace and Nodes).
type Local struct {
	mgr     ctrl.Manager
	cluster *Cluster
}

// NewLocal indexes Nodes by provider ID in mgr's cache. restCfg is the
// operator's client configuration; evictions get a client of their own with
// a higher rate limit than client-go's default (5/s), since many drains
// evict in parallel.
func NewLocal(ctx context.Context, mgr ctrl.Manager, restCfg *rest.Config) (*Local, error) {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &corev1.Node{}, NodeProviderIDIndex, NodeProviderID); err != nil {
		return nil, fmt.Errorf("index Nodes by providerID: %w", err)
	}
	policy, err := evictionClient(restCfg)
	if err != nil {
		return nil, err
	}
	return &Local{mgr: mgr, cluster: &Cluster{
		Client: mgr.GetClient(), Reader: mgr.GetAPIReader(), Policy: policy, Local: true,
		// The events.k8s.io recorder drops Events about cluster-scoped
		// objects such as Nodes; the core/v1 one files them in "default",
		// where kubectl describe node finds them.
		Recorder: mgr.GetEventRecorderFor("nstance-operator"), //nolint:staticcheck // core/v1 on purpose, see above
	}}, nil
}

// Mode is InCluster.
func (l *Local) Mode() Mode { return InCluster }

// Cluster returns the operator's own cluster for every key.
func (l *Local) Cluster(context.Context, client.ObjectKey) (*Cluster, error) { return l.cluster, nil }

// Watch watches kind through the manager's cache, once.
func (l *Local) Watch(_ client.ObjectKey, ctl controller.Controller, _ string, kind client.Object, h handler.EventHandler, preds ...predicate.Predicate) error {
	return ctl.Watch(source.Kind(l.mgr.GetCache(), kind, h, preds...))
}

func evictionClient(cfg *rest.Config) (rest.Interface, error) {
	c := rest.CopyConfig(cfg)
	c.QPS, c.Burst = 100, 200
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("create eviction client: %w", err)
	}
	return cs.PolicyV1().RESTClient(), nil
}
