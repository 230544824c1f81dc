package paused

import (
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

func TestCheck(t *testing.T) {
	s := runtime.NewScheme()
	require.NoError(t, clusterv1.AddToScheme(s))
	require.NoError(t, infrav1.AddToScheme(s))
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(
		&clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "paused"}, Spec: clusterv1.ClusterSpec{Paused: ptr.To(true)}},
		&clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "annotated", Annotations: map[string]string{clusterv1.PausedAnnotation: ""}}},
		&clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "running"}},
	).Build()
	pool := func(ann bool, cluster string) client.Object {
		p := &infrav1.NstanceMachinePool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Labels: map[string]string{}, Annotations: map[string]string{}}}
		if ann {
			p.Annotations[clusterv1.PausedAnnotation] = "true"
		}
		if cluster != "" {
			p.Labels[clusterv1.ClusterNameLabel] = cluster
		}
		return p
	}
	tests := []struct {
		name string
		objs []client.Object
		want bool
	}{
		{"annotated object", []client.Object{pool(true, "")}, true},
		{"annotated second object", []client.Object{pool(false, ""), pool(true, "")}, true},
		{"cluster spec.paused", []client.Object{pool(false, "paused")}, true},
		{"annotated cluster is not paused (as in Cluster API)", []client.Object{pool(false, "annotated")}, false},
		{"running cluster", []client.Object{pool(false, "running")}, false},
		{"missing cluster", []client.Object{pool(false, "gone")}, false},
		{"no cluster label", []client.Object{pool(false, "")}, false},
		{"nil skipped", []client.Object{nil, pool(false, "")}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Check(t.Context(), c, "ns", tt.objs...)
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

// TestEnsureCondition: the Paused condition is written when the pause
// state changes and stops the pass; a paused object that already says so
// is not written again, not even after a spec change.
func TestEnsureCondition(t *testing.T) {
	ctx := t.Context()
	s := runtime.NewScheme()
	require.NoError(t, clusterv1.AddToScheme(s))
	require.NoError(t, infrav1.AddToScheme(s))
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}, Spec: clusterv1.ClusterSpec{Paused: ptr.To(true)}}
	pool := &infrav1.NstanceMachinePool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Generation: 1,
		Labels: map[string]string{clusterv1.ClusterNameLabel: "c"}}}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(cluster, pool).WithStatusSubresource(pool).Build()
	reload := func() *infrav1.NstanceMachinePool {
		p := &infrav1.NstanceMachinePool{}
		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(pool), p))
		return p
	}

	p := reload()
	got, stop, err := Ensure(ctx, c, p)
	require.NoError(t, err)
	require.True(t, stop)
	require.Equal(t, "c", got.Name)
	p = reload()
	require.True(t, conditions.IsTrue(p, clusterv1.PausedCondition), "paused: condition written")

	// A spec change (new generation) while paused writes nothing.
	p.Spec.Template = "other"
	require.NoError(t, c.Update(ctx, p))
	p = reload()
	rv := p.ResourceVersion
	stop, err = EnsureCondition(ctx, c, cluster, p)
	require.NoError(t, err)
	require.True(t, stop)
	require.Equal(t, rv, reload().ResourceVersion, "no write while paused")

	// Unpaused: the condition turns false and the pass stops once.
	cluster.Spec.Paused = ptr.To(false)
	stop, err = EnsureCondition(ctx, c, cluster, p)
	require.NoError(t, err)
	require.True(t, stop)
	p = reload()
	require.True(t, conditions.IsFalse(p, clusterv1.PausedCondition))
	stop, err = EnsureCondition(ctx, c, cluster, p)
	require.NoError(t, err)
	require.False(t, stop, "unpaused and recorded: the pass goes on")

	// The object's own annotation pauses it without a Cluster.
	p.Annotations = map[string]string{clusterv1.PausedAnnotation: ""}
	stop, err = EnsureCondition(ctx, c, nil, p)
	require.NoError(t, err)
	require.True(t, stop)
	require.True(t, conditions.IsTrue(reload(), clusterv1.PausedCondition))
}

// TestEnsureDeferred: an object that is not paused gets nothing written
// and the pass goes on; SetNotPaused puts the condition in memory for the
// caller's patch helper. A paused one is written and stops, as with Ensure.
func TestEnsureDeferred(t *testing.T) {
	ctx := t.Context()
	s := runtime.NewScheme()
	require.NoError(t, clusterv1.AddToScheme(s))
	require.NoError(t, infrav1.AddToScheme(s))
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}
	pool := &infrav1.NstanceMachinePool{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Generation: 3,
		Labels: map[string]string{clusterv1.ClusterNameLabel: "c"}}}
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(cluster, pool).WithStatusSubresource(pool).Build()
	reload := func() *infrav1.NstanceMachinePool {
		p := &infrav1.NstanceMachinePool{}
		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(pool), p))
		return p
	}

	p := reload()
	rv := p.ResourceVersion
	got, stop, err := EnsureDeferred(ctx, c, p)
	require.NoError(t, err)
	require.False(t, stop, "a new object that is not paused goes on at once")
	require.Equal(t, "c", got.Name)
	require.Equal(t, rv, reload().ResourceVersion, "nothing written")
	require.Nil(t, conditions.Get(p, clusterv1.PausedCondition))
	SetNotPaused(p)
	cond := conditions.Get(p, clusterv1.PausedCondition)
	require.NotNil(t, cond)
	require.Equal(t, metav1.ConditionFalse, cond.Status)
	require.Equal(t, clusterv1.NotPausedReason, cond.Reason)
	require.Equal(t, int64(3), cond.ObservedGeneration)

	p = reload()
	p.Annotations = map[string]string{clusterv1.PausedAnnotation: ""}
	_, stop, err = EnsureDeferred(ctx, c, p)
	require.NoError(t, err)
	require.True(t, stop)
	require.True(t, conditions.IsTrue(reload(), clusterv1.PausedCondition), "paused: written at once")
}
