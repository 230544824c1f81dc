package machinepool

import (
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

func shardGroup(shard string, replicas int32, ready bool, ids ...string) infrav1.NstanceShardGroup {
	st := metav1.ConditionFalse
	reason := infrav1.WaitingForReplicasReason
	if ready {
		st, reason = metav1.ConditionTrue, infrav1.SyncedReason
	}
	return infrav1.NstanceShardGroup{
		ObjectMeta: metav1.ObjectMeta{Generation: 2},
		Spec:       infrav1.NstanceShardGroupSpec{Group: "g", Shard: shard},
		Status: infrav1.NstanceShardGroupStatus{
			Replicas: replicas, ReadyReplicas: replicas, ProviderIDs: ids,
			Conditions: []metav1.Condition{
				{Type: infrav1.ReadyCondition, Status: st, Reason: reason, ObservedGeneration: 2},
				{Type: infrav1.ConfigValidCondition, Status: metav1.ConditionTrue, Reason: infrav1.ConfigAcceptedReason, ObservedGeneration: 2},
			},
		},
	}
}

// rejected marks a shard group's configuration refused by its server.
func rejected(sg infrav1.NstanceShardGroup) infrav1.NstanceShardGroup {
	sg.Status.Conditions[1].Status, sg.Status.Conditions[1].Reason = metav1.ConditionFalse, infrav1.ConfigRejectedReason
	sg.Status.Conditions[0].Status, sg.Status.Conditions[0].Reason = metav1.ConditionFalse, infrav1.ConfigRejectedReason
	return sg
}

func TestAggregate(t *testing.T) {
	tests := []struct {
		name      string
		sgs       []infrav1.NstanceShardGroup
		shards    []string
		desired   int32
		wantIDs   []string
		wantRepl  int32
		wantProv  bool
		wantReady bool
		reason    string
	}{
		{
			name:   "all ready, sorted union",
			sgs:    []infrav1.NstanceShardGroup{shardGroup("b", 2, true, "p://b/2", "p://b/1"), shardGroup("a", 1, true, "p://a/1")},
			shards: []string{"a", "b"}, desired: 3,
			wantIDs: []string{"p://a/1", "p://b/1", "p://b/2"}, wantRepl: 3, wantProv: true, wantReady: true, reason: infrav1.SyncedReason,
		},
		{
			name:   "missing shard group",
			sgs:    []infrav1.NstanceShardGroup{shardGroup("a", 1, true, "p://a/1")},
			shards: []string{"a", "b"}, desired: 1,
			wantIDs: []string{"p://a/1"}, wantRepl: 1, reason: ShardGroupsNotReadyReason,
		},
		{
			name:   "shard group accepted, still scaling: provisioned, not ready",
			sgs:    []infrav1.NstanceShardGroup{shardGroup("a", 1, true, "p://a/1"), shardGroup("b", 0, false)},
			shards: []string{"a", "b"}, desired: 2,
			wantIDs: []string{"p://a/1"}, wantRepl: 1, wantProv: true, reason: ShardGroupsNotReadyReason,
		},
		{
			name:   "shard group rejected by its server: not provisioned",
			sgs:    []infrav1.NstanceShardGroup{shardGroup("a", 1, true, "p://a/1"), rejected(shardGroup("b", 0, false))},
			shards: []string{"a", "b"}, desired: 2,
			wantIDs: []string{"p://a/1"}, wantRepl: 1, reason: ShardGroupsNotReadyReason,
		},
		{
			name:   "count differs from desired",
			sgs:    []infrav1.NstanceShardGroup{shardGroup("a", 1, true, "p://a/1")},
			shards: []string{"a"}, desired: 2,
			wantIDs: []string{"p://a/1"}, wantRepl: 1, wantProv: true, reason: infrav1.WaitingForReplicasReason,
		},
		{
			name:   "zero replicas is ready",
			sgs:    []infrav1.NstanceShardGroup{shardGroup("a", 0, true)},
			shards: []string{"a"}, desired: 0, wantProv: true, wantReady: true, reason: infrav1.SyncedReason,
		},
		{
			name:   "no shards",
			shards: nil, desired: 0, wantReady: true, reason: infrav1.SyncedReason,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Aggregate(tt.sgs, tt.shards, tt.desired)
			require.Equal(t, tt.wantIDs, got.ProviderIDs)
			require.Equal(t, tt.wantRepl, got.Replicas)
			require.Equal(t, tt.wantProv, got.Provisioned)
			require.Equal(t, tt.wantReady, got.Ready)
			require.Equal(t, tt.reason, got.Reason)
		})
	}
}

func TestStaleConditionIsNotReady(t *testing.T) {
	sg := shardGroup("a", 1, true, "p://a/1")
	sg.Generation = 3 // spec changed since the condition was written
	got := Aggregate([]infrav1.NstanceShardGroup{sg}, []string{"a"}, 1)
	require.False(t, got.Ready)
}

func TestInfraRefName(t *testing.T) {
	mp := func(group, kind, name string) *clusterv1.MachinePool {
		return &clusterv1.MachinePool{Spec: clusterv1.MachinePoolSpec{Template: clusterv1.MachineTemplateSpec{Spec: clusterv1.MachineSpec{
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: group, Kind: kind, Name: name},
		}}}}
	}
	require.Equal(t, []string{"w"}, InfraRefName(mp(infrav1.GroupVersion.Group, "NstanceMachinePool", "w")))
	require.Nil(t, InfraRefName(mp("other.example.com", "NstanceMachinePool", "w")))
	require.Nil(t, InfraRefName(mp(infrav1.GroupVersion.Group, "NstanceMachine", "w")))
	require.Nil(t, InfraRefName(&infrav1.NstanceMachinePool{}))
	m := mp(infrav1.GroupVersion.Group, "NstanceMachinePool", "w")
	m.Namespace = "ns"
	reqs := mapMachinePool(t.Context(), m)
	require.Len(t, reqs, 1)
	require.Equal(t, "ns", reqs[0].Namespace)
	require.Equal(t, "w", reqs[0].Name)
}
