package machinepool

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/ledger"
)

// TestPoolWaitsForBootstrapData: a MachinePool whose template names no
// bootstrap data Secret yet (nil) gets no shard groups and the pool says
// WaitingForBootstrapData; once it is named, the shard groups carry it, and
// a new name reaches them.
func TestPoolWaitsForBootstrapData(t *testing.T) {
	ctx := context.Background()
	s := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(s))
	require.NoError(t, clusterv1.AddToScheme(s))
	require.NoError(t, infrav1.AddToScheme(s))
	mp := &clusterv1.MachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "mp-uid"},
		Spec: clusterv1.MachinePoolSpec{ClusterName: "c", Replicas: ptr.To[int32](3), Template: clusterv1.MachineTemplateSpec{
			Spec: clusterv1.MachineSpec{ClusterName: "c", InfrastructureRef: clusterv1.ContractVersionedObjectReference{
				APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceMachinePool", Name: "web",
			}},
		}},
	}
	pool := &infrav1.NstanceMachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: clusterv1.GroupVersion.String(), Kind: "MachinePool", Name: "web", UID: "mp-uid",
		}}},
		Spec: infrav1.NstanceMachinePoolSpec{Group: "web", Shards: []string{"a", "b"}, Template: "worker"},
	}
	cl := fake.NewClientBuilder().WithScheme(s).WithObjects(mp, pool).
		WithStatusSubresource(&infrav1.NstanceMachinePool{}, &infrav1.NstanceShardGroup{}).
		WithIndex(&clusterv1.MachinePool{}, InfraRefIndex, InfraRefName).Build()
	r := &Reconciler{Client: cl, Ledger: ledger.New(cl, "ns", "")}
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(pool)}
	pass := func() *infrav1.NstanceMachinePool {
		t.Helper()
		for range 2 {
			_, err := r.Reconcile(ctx, req)
			require.NoError(t, err)
		}
		var got infrav1.NstanceMachinePool
		require.NoError(t, cl.Get(ctx, req.NamespacedName, &got))
		return &got
	}
	shardGroups := func() map[string]string {
		t.Helper()
		var list infrav1.NstanceShardGroupList
		require.NoError(t, cl.List(ctx, &list, client.InNamespace("ns")))
		out := map[string]string{}
		for _, sg := range list.Items {
			out[sg.Spec.Shard] = sg.Spec.BootstrapDataSecretName
		}
		return out
	}

	got := pass()
	ready := conditions.Get(got, infrav1.ReadyCondition)
	require.NotNil(t, ready)
	require.Equal(t, infrav1.WaitingForBootstrapDataReason, ready.Reason)
	require.Contains(t, ready.Message, "dataSecretName")
	require.Empty(t, shardGroups(), "no shard group before the bootstrap data exists")

	setSecret := func(name string) {
		t.Helper()
		var cur clusterv1.MachinePool
		require.NoError(t, cl.Get(ctx, client.ObjectKeyFromObject(mp), &cur))
		cur.Spec.Template.Spec.Bootstrap.DataSecretName = ptr.To(name)
		require.NoError(t, cl.Update(ctx, &cur))
	}
	setSecret("web-boot-1")
	got = pass()
	require.NotEqual(t, infrav1.WaitingForBootstrapDataReason, conditions.Get(got, infrav1.ReadyCondition).Reason)
	require.Equal(t, map[string]string{"a": "web-boot-1", "b": "web-boot-1"}, shardGroups())

	setSecret("web-boot-2")
	pass()
	require.Equal(t, map[string]string{"a": "web-boot-2", "b": "web-boot-2"}, shardGroups())

	// Back to nil (not something CAPI does, but possible by hand): the
	// shard groups stay as they are.
	var cur clusterv1.MachinePool
	require.NoError(t, cl.Get(ctx, client.ObjectKeyFromObject(mp), &cur))
	cur.Spec.Template.Spec.Bootstrap.DataSecretName = nil
	cur.Spec.Replicas = ptr.To[int32](0)
	require.NoError(t, cl.Update(ctx, &cur))
	got = pass()
	require.Equal(t, infrav1.WaitingForBootstrapDataReason, conditions.Get(got, infrav1.ReadyCondition).Reason)
	var sg infrav1.NstanceShardGroup
	require.NoError(t, cl.Get(ctx, client.ObjectKey{Namespace: "ns", Name: infrav1.ShardGroupName("web", "a")}, &sg))
	require.Equal(t, int32(2), sg.Spec.Size, "existing shard groups are not scaled while waiting")
	require.Equal(t, "web-boot-2", sg.Spec.BootstrapDataSecretName)
}
