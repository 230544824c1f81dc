package importer

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// TestImportBlocked: groups are imported only for a Cluster that exists, is
// not being deleted and is not paused.
func TestImportBlocked(t *testing.T) {
	now := metav1.Now()
	for _, tc := range []struct {
		name    string
		cluster *clusterv1.Cluster
		want    string
	}{
		{"missing (a move target before the move)", nil, "the Cluster does not exist yet"},
		{"paused (clusterctl move)", &clusterv1.Cluster{Spec: clusterv1.ClusterSpec{Paused: ptr.To(true)}}, "the Cluster is paused"},
		{"deleting", &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now, Finalizers: []string{"x"}}}, "the Cluster is being deleted"},
		{"unpaused", &clusterv1.Cluster{Spec: clusterv1.ClusterSpec{Paused: ptr.To(false)}}, ""},
		{"paused unset", &clusterv1.Cluster{}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, ImportBlocked(tc.cluster))
		})
	}
}

// TestWaitCluster: the import does not start while the operator's Cluster
// is missing or paused (clusterctl move) and starts once it exists and runs.
func TestWaitCluster(t *testing.T) {
	s := runtime.NewScheme()
	require.NoError(t, clusterv1.AddToScheme(s))
	cl := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}, Spec: clusterv1.ClusterSpec{Paused: ptr.To(true)}}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(cl).Build()
	im := &Importer{Reader: c, Namespace: "ns", ClusterName: "c", Log: logr.Discard()}

	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	require.Error(t, im.waitCluster(ctx), "still paused when the context ends")

	done := make(chan error, 1)
	go func() { done <- im.waitCluster(t.Context()) }()
	select {
	case err := <-done:
		t.Fatalf("returned while paused: %v", err)
	case <-time.After(1500 * time.Millisecond):
	}
	cl.Spec.Paused = ptr.To(false)
	require.NoError(t, c.Update(t.Context(), cl))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("did not return after the Cluster was unpaused")
	}

	// No Cluster at all (a move target before the move arrives): wait.
	im.ClusterName = "missing"
	ctx2, cancel2 := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel2()
	require.Error(t, im.waitCluster(ctx2), "no Cluster yet when the context ends")
}
