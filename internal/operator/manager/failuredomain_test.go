package manager_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/machine"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// TestShardMismatch: an NstanceMachine whose spec.shard differs from its
// Machine's failureDomain gets no instance anywhere and says why (conditions
// and a Warning Event); once spec.shard agrees, the instance is created in
// the failure domain.
func TestShardMismatch(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "shard-a", "shard-b")
	f.putNonce(t)
	r := startOperator(t, f.options(t))
	r.waitImported(t)
	f.createPool(t, "solo", 0, "shard-a", "shard-b")
	f.waitGroupOnShards(t, "solo", "shard-a", "shard-b")

	pair := func(name, fd, shard string) {
		t.Helper()
		labels := map[string]string{clusterv1.ClusterNameLabel: clusterID}
		m := &clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: labels},
			Spec: clusterv1.MachineSpec{ClusterName: clusterID, FailureDomain: fd,
				Bootstrap:         clusterv1.Bootstrap{DataSecretName: ptr.To("")},
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceMachine", Name: name}},
		}
		require.NoError(t, env.Client.Create(ctx, m))
		require.NoError(t, env.Client.Create(ctx, &infrav1.NstanceMachine{
			ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: labels,
				OwnerReferences: []metav1.OwnerReference{{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Name: m.Name, UID: m.UID}}},
			Spec: infrav1.NstanceMachineSpec{Group: "solo", Shard: shard},
		}))
	}
	pair("m-mismatch", "shard-b", "shard-a")
	require.Eventually(t, func() bool {
		got, _ := get(t, f.ns, "m-mismatch", &infrav1.NstanceMachine{})
		c := meta.FindStatusCondition(got.Status.Conditions, machine.ConditionInstanceCreated)
		ready := meta.FindStatusCondition(got.Status.Conditions, machine.ConditionReady)
		return c != nil && c.Reason == machine.ReasonShardMismatch && c.Status == metav1.ConditionFalse &&
			ready != nil && ready.Reason == machine.ReasonShardMismatch
	}, waitLong, tick, "the mismatch is reported on the NstanceMachine")
	got, _ := get(t, f.ns, "m-mismatch", &infrav1.NstanceMachine{})
	c := meta.FindStatusCondition(got.Status.Conditions, machine.ConditionInstanceCreated)
	require.Contains(t, c.Message, `spec.shard "shard-a" differs from the failureDomain "shard-b"`)
	require.Empty(t, got.Status.InstanceID)
	require.Eventually(t, func() bool {
		return len(f.events(t, "NstanceMachine", "m-mismatch", machine.ReasonShardMismatch)) > 0
	}, waitLong, tick, "a Warning Event names the mismatch")
	for _, s := range []string{"shard-a", "shard-b"} {
		resp, err := f.shards[s].client(t).ListInstances(ctx, &nstancev1.ListInstancesRequest{})
		require.NoError(t, err)
		require.Empty(t, resp.GetInstances(), "no instance on %s", s)
	}

	// spec.shard equal to the failure domain: created there. The
	// mismatched machine goes without an instance to delete.
	pair("m-agree", "shard-b", "shard-b")
	running := waitMachineRunning(t, f.ns, "m-agree")
	require.Equal(t, "shard-b", running.Status.Shard)
	require.NoError(t, env.Client.Delete(ctx, got))
	require.Eventually(t, func() bool {
		_, ok := get(t, f.ns, "m-mismatch", &infrav1.NstanceMachine{})
		return !ok
	}, waitLong, tick)
}
