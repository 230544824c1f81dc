package cluster_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cpv1 "github.com/nstance-dev/nstance/api/controlplane/v1beta1"
	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/cluster"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

func TestClusterObjects(t *testing.T) {
	env := kubetest.Start(t)
	ctx := t.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "cc-"}}
	require.NoError(t, env.Client.Create(ctx, ns))

	ep, err := cluster.Endpoint(env.Config.Host)
	require.NoError(t, err)
	require.NoError(t, cluster.EnsureObjects(ctx, env.Client, ns.Name, "prod", ep))
	require.NoError(t, cluster.EnsureObjects(ctx, env.Client, ns.Name, "prod", ep), "idempotent")
	key := client.ObjectKey{Namespace: ns.Name, Name: "prod"}
	var cl clusterv1.Cluster
	require.NoError(t, env.Client.Get(ctx, key, &cl))
	require.Equal(t, clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceCluster", Name: "prod"},
		cl.Spec.InfrastructureRef)
	require.Equal(t, clusterv1.ContractVersionedObjectReference{APIGroup: cpv1.GroupVersion.Group, Kind: "NstanceControlPlane", Name: "prod"},
		cl.Spec.ControlPlaneRef)
	var cp cpv1.NstanceControlPlane
	require.NoError(t, env.Client.Get(ctx, key, &cp))
	require.Equal(t, ep, cp.Spec.ControlPlaneEndpoint)
	require.Equal(t, "prod", cp.Labels[clusterv1.ClusterNameLabel])

	r := &cluster.Reconciler{Client: env.Client, Shards: []string{"us-west-2a", "us-east-1a"}}
	// The first pass records the Paused condition (false) and ends, the
	// second stores the finalizer.
	for range 3 {
		_, err = r.Reconcile(ctx, ctrl.Request{NamespacedName: key})
		require.NoError(t, err)
	}
	var nc infrav1.NstanceCluster
	require.NoError(t, env.Client.Get(ctx, key, &nc))
	require.True(t, conditions.IsFalse(&nc, clusterv1.PausedCondition))
	require.True(t, conditions.IsTrue(&nc, infrav1.ReadyCondition))
	require.Equal(t, []string{"us-east-1a", "us-west-2a"}, []string{nc.Status.FailureDomains[0].Name, nc.Status.FailureDomains[1].Name})
	require.True(t, nc.Status.Ready)
	require.True(t, *nc.Status.Initialization.Provisioned)
	require.Contains(t, nc.Finalizers, infrav1.ClusterFinalizer)
	require.Equal(t, ep, nc.Spec.ControlPlaneEndpoint)
}

// TestExistingClusterGetsControlPlane: a Cluster an older operator created
// (no controlPlaneRef) is pointed at the NstanceControlPlane; a Cluster
// that already names a control plane keeps it.
func TestExistingClusterGetsControlPlane(t *testing.T) {
	env := kubetest.Start(t)
	ctx := t.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "cc-"}}
	require.NoError(t, env.Client.Create(ctx, ns))
	infraRef := func(name string) clusterv1.ContractVersionedObjectReference {
		return clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceCluster", Name: name}
	}
	legacy := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "legacy"},
		Spec: clusterv1.ClusterSpec{InfrastructureRef: infraRef("legacy")}}
	require.NoError(t, env.Client.Create(ctx, legacy))
	otherRef := clusterv1.ContractVersionedObjectReference{APIGroup: "controlplane.cluster.x-k8s.io", Kind: "KubeadmControlPlane", Name: "kcp"}
	other := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "other"},
		Spec: clusterv1.ClusterSpec{InfrastructureRef: infraRef("other"), ControlPlaneRef: otherRef}}
	require.NoError(t, env.Client.Create(ctx, other))

	ep := infrav1.APIEndpoint{Host: "10.0.0.1", Port: 6443}
	require.NoError(t, cluster.EnsureObjects(ctx, env.Client, ns.Name, "legacy", ep))
	require.NoError(t, cluster.EnsureObjects(ctx, env.Client, ns.Name, "other", ep))
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(legacy), legacy))
	require.Equal(t, "NstanceControlPlane", legacy.Spec.ControlPlaneRef.Kind)
	require.Equal(t, "legacy", legacy.Spec.ControlPlaneRef.Name)
	require.Equal(t, infraRef("legacy"), legacy.Spec.InfrastructureRef)
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(other), other))
	require.Equal(t, otherRef, other.Spec.ControlPlaneRef, "an existing control plane reference is kept")
}

// TestPausedClusterLeftAlone: while its Cluster is paused (clusterctl
// move), EnsureObjects changes nothing and the NstanceCluster gets only its
// Paused condition; unpaused, both do their work.
func TestPausedClusterLeftAlone(t *testing.T) {
	env := kubetest.Start(t)
	ctx := t.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "cc-"}}
	require.NoError(t, env.Client.Create(ctx, ns))
	key := client.ObjectKey{Namespace: ns.Name, Name: "moved"}
	cl := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "moved"},
		Spec: clusterv1.ClusterSpec{Paused: ptr.To(true),
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceCluster", Name: "moved"}}}
	require.NoError(t, env.Client.Create(ctx, cl))
	nc := &infrav1.NstanceCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "moved",
		Labels: map[string]string{clusterv1.ClusterNameLabel: "moved"}}}
	require.NoError(t, env.Client.Create(ctx, nc))
	ep := infrav1.APIEndpoint{Host: "10.0.0.1", Port: 6443}

	require.NoError(t, cluster.EnsureObjects(ctx, env.Client, ns.Name, "moved", ep))
	require.NoError(t, env.Client.Get(ctx, key, cl))
	require.False(t, cl.Spec.ControlPlaneRef.IsDefined(), "a paused Cluster is not patched")
	require.True(t, apierrors.IsNotFound(env.Client.Get(ctx, key, &cpv1.NstanceControlPlane{})), "nothing is created for a paused Cluster")

	r := &cluster.Reconciler{Client: env.Client, Shards: []string{"us-west-2a"}}
	for range 3 {
		_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key})
		require.NoError(t, err)
	}
	require.NoError(t, env.Client.Get(ctx, key, nc))
	require.True(t, conditions.IsTrue(nc, clusterv1.PausedCondition))
	require.False(t, nc.Status.Ready)
	require.Empty(t, nc.Status.FailureDomains)
	rv := nc.ResourceVersion
	_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key})
	require.NoError(t, err)
	require.NoError(t, env.Client.Get(ctx, key, nc))
	require.Equal(t, rv, nc.ResourceVersion, "a paused NstanceCluster is not written again")

	cl.Spec.Paused = ptr.To(false)
	require.NoError(t, env.Client.Update(ctx, cl))
	require.NoError(t, cluster.EnsureObjects(ctx, env.Client, ns.Name, "moved", ep))
	require.NoError(t, env.Client.Get(ctx, key, cl))
	require.Equal(t, "NstanceControlPlane", cl.Spec.ControlPlaneRef.Kind)
	for range 3 {
		_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: key})
		require.NoError(t, err)
	}
	require.NoError(t, env.Client.Get(ctx, key, nc))
	require.True(t, conditions.IsFalse(nc, clusterv1.PausedCondition))
	require.True(t, nc.Status.Ready)
}

func TestEndpoint(t *testing.T) {
	tests := []struct {
		in   string
		want infrav1.APIEndpoint
	}{
		{"https://10.0.0.1:6443", infrav1.APIEndpoint{Host: "10.0.0.1", Port: 6443}},
		{"https://api.example.com", infrav1.APIEndpoint{Host: "api.example.com", Port: 443}},
		{"api.example.com:8443", infrav1.APIEndpoint{Host: "api.example.com", Port: 8443}},
	}
	for _, tt := range tests {
		got, err := cluster.Endpoint(tt.in)
		require.NoError(t, err)
		require.Equal(t, tt.want, got, tt.in)
	}
}
