package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/finalizers"
	"sigs.k8s.io/cluster-api/util/patch"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cpv1 "github.com/nstance-dev/nstance/api/controlplane/v1beta1"
	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/ledger"
	"github.com/nstance-dev/nstance/internal/operator/paused"
	"github.com/nstance-dev/nstance/internal/operator/shardconn"
	"github.com/nstance-dev/nstance/internal/operator/watchfilter"
)

// Reconciler reconciles NstanceClusters.
type Reconciler struct {
	// WatchFilter restricts the controller to objects labelled with it
	// (--watch-filter); empty means every object.
	WatchFilter watchfilter.Filter
	Client      client.Client
	// Reader reads the ledger uncached; nil means Client.
	Reader client.Reader
	// Shards are the configured shard IDs: the failure domains.
	Shards []string
	// Conns reach the shards; a deleted NstanceCluster asks every one.
	Conns *shardconn.Manager
	// Ledger holds every group the operator managed and the groups left on
	// shards (orphans); nil: only the cluster's shard groups are looked at.
	Ledger   *ledger.Ledger
	Recorder events.EventRecorder
	// Cluster is the operator's own Cluster: its deletion waits for every
	// group of the ledger. Zero: every NstanceCluster's does.
	Cluster client.ObjectKey
	// Poll is how often a deleted NstanceCluster looks at the shards again;
	// zero means 2s.
	Poll time.Duration
	// CallTimeout bounds one RPC; zero means 10s.
	CallTimeout time.Duration
}

// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstanceclusters,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstanceclusters/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstanceclusters/finalizers,verbs=update
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=nstanceshardgroups;nstancemachinepools;nstancemachines,verbs=get;list;watch;delete
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters;machinepools;machines,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch;update

// SetupWithManager registers the controller.
func (r *Reconciler) SetupWithManager(mgr ctrl.Manager) error {
	b := ctrl.NewControllerManagedBy(mgr).
		Named("nstancecluster").
		For(&infrav1.NstanceCluster{}, r.WatchFilter.For(mgr.GetScheme(), mgr.GetLogger()))
	b, err := paused.WatchClusters(b, mgr, &infrav1.NstanceClusterList{}, mgr.GetLogger())
	if err != nil {
		return err
	}
	return b.Complete(r)
}

// Reconcile implements reconcile.Reconciler. Changes are written once, at
// the end, by Cluster API's patch helper; a paused NstanceCluster gets its
// Paused condition and nothing else.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	var nc infrav1.NstanceCluster
	if err := r.Client.Get(ctx, req.NamespacedName, &nc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if !r.WatchFilter.Matches(&nc) {
		return ctrl.Result{}, nil // another operator's (--watch-filter)
	}
	if _, stop, err := paused.EnsureDeferred(ctx, r.Client, &nc); err != nil || stop {
		return ctrl.Result{}, err
	}
	if nc.DeletionTimestamp.IsZero() {
		// As CAPD: the finalizer is stored alone, and the pass ends.
		if added, err := finalizers.EnsureFinalizer(ctx, r.Client, &nc, infrav1.ClusterFinalizer); err != nil || added {
			return ctrl.Result{}, err
		}
	}
	helper, err := patch.NewHelper(&nc, r.Client)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("patch helper for NstanceCluster %s: %w", nc.Name, err)
	}
	paused.SetNotPaused(&nc) // written by the deferred patch (EnsureDeferred)
	defer func() {
		if err := helper.Patch(ctx, &nc, patch.WithOwnedConditions{Conditions: []string{clusterv1.PausedCondition, infrav1.ReadyCondition}}); err != nil {
			retErr = errors.Join(retErr, fmt.Errorf("patch NstanceCluster %s: %w", nc.Name, err))
		}
	}()
	if !nc.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, &nc)
	}
	nc.Status.FailureDomains = nil
	for _, s := range slices.Sorted(slices.Values(r.Shards)) {
		nc.Status.FailureDomains = append(nc.Status.FailureDomains, infrav1.FailureDomain{Name: s, ControlPlane: ptr.To(false)})
	}
	nc.Status.Ready = true
	nc.Status.Initialization.Provisioned = ptr.To(true)
	nc.Status.ObservedGeneration = nc.Generation
	conditions.Set(&nc, metav1.Condition{Type: infrav1.ReadyCondition, Status: metav1.ConditionTrue, Reason: infrav1.SyncedReason})
	return ctrl.Result{}, nil
}

// Endpoint splits an API server URL (or host:port) into an APIEndpoint.
func Endpoint(server string) (infrav1.APIEndpoint, error) {
	host := server
	if u, err := url.Parse(server); err == nil && u.Host != "" {
		host = u.Host
	}
	h, p, err := net.SplitHostPort(host)
	if err != nil {
		return infrav1.APIEndpoint{Host: host, Port: 443}, nil
	}
	port, err := strconv.ParseInt(p, 10, 32)
	if err != nil || port < 1 || port > 65535 {
		return infrav1.APIEndpoint{}, fmt.Errorf("API server %q: bad port", server)
	}
	return infrav1.APIEndpoint{Host: h, Port: int32(port)}, nil
}

// EnsureObjects creates the NstanceCluster, NstanceControlPlane and CAPI
// Cluster named name when they do not exist, as the cluster templates
// declare them. The operator does not call it (Cluster objects are the
// user's; a deleted Cluster must stay deleted): tests and tools do. It gives
// an existing Cluster
// that has no control plane (made by an operator before the
// NstanceControlPlane existed) a reference to it. Everything else on
// existing objects is left as it is. A paused Cluster (clusterctl move in
// progress) is left alone entirely, and so are its objects.
func EnsureObjects(ctx context.Context, c client.Client, namespace, name string, endpoint infrav1.APIEndpoint) error {
	existing, err := paused.ClusterNamed(ctx, c, namespace, name)
	if err != nil {
		return err
	}
	if paused.IsClusterPaused(existing) {
		return nil
	}
	return ensureObjects(ctx, c, namespace, name, endpoint)
}

func ensureObjects(ctx context.Context, c client.Client, namespace, name string, endpoint infrav1.APIEndpoint) error {
	labels := map[string]string{clusterv1.ClusterNameLabel: name}
	nc := &infrav1.NstanceCluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
		Spec:       infrav1.NstanceClusterSpec{ControlPlaneEndpoint: endpoint},
	}
	if err := c.Create(ctx, nc); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create NstanceCluster %s/%s: %w", namespace, name, err)
	}
	cp := &cpv1.NstanceControlPlane{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: labels},
		Spec:       cpv1.NstanceControlPlaneSpec{ControlPlaneEndpoint: endpoint},
	}
	if err := c.Create(ctx, cp); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create NstanceControlPlane %s/%s: %w", namespace, name, err)
	}
	cpRef := clusterv1.ContractVersionedObjectReference{APIGroup: cpv1.GroupVersion.Group, Kind: "NstanceControlPlane", Name: name}
	cl := &clusterv1.Cluster{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: clusterv1.ClusterSpec{
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceCluster", Name: name,
			},
			ControlPlaneRef: cpRef,
		},
	}
	err := c.Create(ctx, cl)
	if err == nil {
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create Cluster %s/%s: %w", namespace, name, err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(cl), cl); err != nil {
		return fmt.Errorf("get Cluster %s/%s: %w", namespace, name, err)
	}
	if cl.Spec.ControlPlaneRef.IsDefined() {
		return nil
	}
	patch := client.MergeFromWithOptions(cl.DeepCopy(), client.MergeFromWithOptimisticLock{})
	cl.Spec.ControlPlaneRef = cpRef
	if err := c.Patch(ctx, cl, patch); err != nil {
		return fmt.Errorf("set controlPlaneRef of Cluster %s/%s: %w", namespace, name, err)
	}
	return nil
}
