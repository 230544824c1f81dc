package e2e

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

// labeler marks every ConfigMap it reconciles and remembers the data it saw.
type labeler struct {
	c    client.Client
	mu   sync.Mutex
	seen map[string]map[string]string
}

func (l *labeler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var cm corev1.ConfigMap
	if err := l.c.Get(ctx, req.NamespacedName, &cm); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	l.mu.Lock()
	l.seen[req.Name] = cm.Data
	l.mu.Unlock()
	if cm.Labels["reconciled"] == "true" {
		return ctrl.Result{}, nil
	}
	patch := client.MergeFrom(cm.DeepCopy())
	if cm.Labels == nil {
		cm.Labels = map[string]string{}
	}
	cm.Labels["reconciled"] = "true"
	return ctrl.Result{}, l.c.Patch(ctx, &cm, patch)
}

func (l *labeler) data(name string) map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seen[name]
}

func TestControllerRuntimeManager(t *testing.T) {
	root, err := kubetest.RepoRoot()
	require.NoError(t, err)
	capi, err := kubetest.CAPICRDDir(root)
	require.NoError(t, err)
	d := startDev(t, false, capi, filepath.Join(root, "config", "crd", "bases"))
	scheme, err := kubetest.NewScheme()
	require.NoError(t, err)

	mgr, err := ctrl.NewManager(d.config, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:  "0",
		LeaderElection:          true,
		LeaderElectionID:        "devk8s-e2e",
		LeaderElectionNamespace: "default",
		// Controller names are checked process-wide; -count=N reruns this test.
		Controller: config.Controller{SkipNameValidation: ptr.To(true)},
	})
	require.NoError(t, err)
	rec := &labeler{c: mgr.GetClient(), seen: map[string]map[string]string{}}
	require.NoError(t, ctrl.NewControllerManagedBy(mgr).For(&corev1.ConfigMap{}).Complete(rec))
	// A cached informer on a Cluster API kind served from its CRD.
	clusters := &unstructured.UnstructuredList{}
	clusters.SetGroupVersionKind(clusterv1.GroupVersion.WithKind("ClusterList"))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	require.True(t, mgr.GetCache().WaitForCacheSync(ctx))

	direct, err := client.New(d.config, client.Options{Scheme: scheme})
	require.NoError(t, err)
	require.NoError(t, direct.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "one", Namespace: "default"}, Data: map[string]string{"k": "v"}}))

	// The reconciler's patch shows up through the manager's cache.
	require.Eventually(t, func() bool {
		var cm corev1.ConfigMap
		err := mgr.GetClient().Get(ctx, types.NamespacedName{Namespace: "default", Name: "one"}, &cm)
		return err == nil && cm.Labels["reconciled"] == "true"
	}, 10*time.Second, 50*time.Millisecond)

	// A hand edit of the file reaches the informer and the reconciler.
	path := filepath.Join(d.dir, "configmaps", "default", "one.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"data":{"k":"edited"},"metadata":{"labels":{"reconciled":"true"}}}`), 0o644))
	require.Eventually(t, func() bool { return rec.data("one")["k"] == "edited" }, 10*time.Second, 50*time.Millisecond)

	// The CAPI kind lists through the cache (informer started on demand).
	// (With a spec: dev-k8s validates it against the CRD, as a cluster does.)
	require.NoError(t, direct.Create(ctx, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Name: "c1", Namespace: "default"},
		Spec: clusterv1.ClusterSpec{Paused: ptr.To(true)}}))
	require.Eventually(t, func() bool {
		return mgr.GetClient().List(ctx, clusters, client.InNamespace("default")) == nil && len(clusters.Items) == 1
	}, 10*time.Second, 50*time.Millisecond)

	// Leader election used a Lease.
	cs, err := kubernetes.NewForConfig(d.config)
	require.NoError(t, err)
	lease, err := cs.CoordinationV1().Leases("default").Get(ctx, "devk8s-e2e", metav1.GetOptions{})
	require.NoError(t, err)
	require.NotNil(t, lease.Spec.HolderIdentity)

	// Deleting reaches the reconciler as a NotFound.
	require.NoError(t, direct.Delete(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "one", Namespace: "default"}}))
	require.Eventually(t, func() bool {
		var cm corev1.ConfigMap
		return apierrors.IsNotFound(mgr.GetClient().Get(ctx, types.NamespacedName{Namespace: "default", Name: "one"}, &cm))
	}, 10*time.Second, 50*time.Millisecond)
}
