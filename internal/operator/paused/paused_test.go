package paused

import (
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
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
