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

// TestWaitUnpaused: the import does not start while the operator's Cluster
// is paused (clusterctl move) and starts once it resumes.
func TestWaitUnpaused(t *testing.T) {
	s := runtime.NewScheme()
	require.NoError(t, clusterv1.AddToScheme(s))
	cl := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}, Spec: clusterv1.ClusterSpec{Paused: ptr.To(true)}}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(cl).Build()
	im := &Importer{Reader: c, Namespace: "ns", ClusterName: "c", Log: logr.Discard()}

	ctx, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	require.Error(t, im.waitUnpaused(ctx), "still paused when the context ends")

	done := make(chan error, 1)
	go func() { done <- im.waitUnpaused(t.Context()) }()
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

	// No Cluster at all (not created yet): nothing to wait for.
	im.ClusterName = "missing"
	require.NoError(t, im.waitUnpaused(t.Context()))
}
