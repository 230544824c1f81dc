package cluster

import (
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nstance-dev/nstance/internal/operator/ledger"
)

func TestDecideDelete(t *testing.T) {
	clean := func(s string) ShardState { return ShardState{Shard: s} }
	down := func(s string, groups ...string) ShardState {
		return ShardState{Shard: s, Err: "connection refused", Groups: groups}
	}
	for _, tc := range []struct {
		name string
		in   DeleteInput
		want DeleteDecision
	}{
		{"nothing left anywhere", DeleteInput{Shards: []ShardState{clean("a"), clean("b")}},
			DeleteDecision{Release: true}},
		{"no shard configured", DeleteInput{}, DeleteDecision{Release: true}},
		{"objects still there", DeleteInput{Objects: []string{"NstanceShardGroup/web--a", "NstanceMachinePool/web"}, Shards: []ShardState{clean("a")}},
			DeleteDecision{Reason: ReasonWaitingForObjects,
				Message: "waiting for 2 objects of the cluster to be deleted (NstanceShardGroup/web--a, NstanceMachinePool/web)"}},
		{"many objects are cut short", DeleteInput{Objects: []string{"1", "2", "3", "4", "5", "6", "7"}},
			DeleteDecision{Reason: ReasonWaitingForObjects, Message: "waiting for 7 objects of the cluster to be deleted (1, 2, 3, 4, 5 and 2 more)"}},
		{"surge and pending instances on a reachable shard", DeleteInput{Shards: []ShardState{clean("a"),
			{Shard: "b", Left: map[string][]string{"web": {"i-2", "i-3"}, "db": {"i-9"}}}}},
			DeleteDecision{Reason: ReasonDeletingInstances, Message: "waiting for 3 instances on shard b (db: i-9; web: i-2, i-3)"}},
		{"an unreachable shard is waited for", DeleteInput{Shards: []ShardState{clean("a"), down("b", "web")}},
			DeleteDecision{Reason: ReasonWaitingForShard, Message: "waiting for shard b, which cannot be reached (connection refused)"}},
		{"abandon gives up the unreachable shard", DeleteInput{Abandon: true, Shards: []ShardState{clean("a"), down("b", "web")}},
			DeleteDecision{Release: true, Abandoned: []ShardState{down("b", "web")}}},
		{"abandon never skips a reachable shard's instances", DeleteInput{Abandon: true, Shards: []ShardState{
			{Shard: "a", Left: map[string][]string{"web": {"i-1"}}}, down("b", "web")}},
			DeleteDecision{Reason: ReasonDeletingInstances, Message: "waiting for 1 instances on shard a (web: i-1)", Abandoned: []ShardState{down("b", "web")}}},
		{"abandon never skips the cluster's objects", DeleteInput{Abandon: true, Objects: []string{"NstanceMachine/m"}, Shards: []ShardState{down("b")}},
			DeleteDecision{Reason: ReasonWaitingForObjects, Message: "waiting for 1 objects of the cluster to be deleted (NstanceMachine/m)",
				Abandoned: []ShardState{down("b")}}},
		{"everything at once: the first reason, every wait", DeleteInput{Objects: []string{"NstanceMachinePool/web"}, Shards: []ShardState{
			down("a"), {Shard: "b", Left: map[string][]string{"web": {"i-1"}}}}},
			DeleteDecision{Reason: ReasonWaitingForObjects, Message: "waiting for 1 objects of the cluster to be deleted (NstanceMachinePool/web), " +
				"and shard a, which cannot be reached (connection refused), and 1 instances on shard b (web: i-1)"}},
		{"groups on unconfigured shards are reported, not waited for", DeleteInput{Shards: []ShardState{clean("a")},
			Unconfigured: []ledger.Orphan{{Group: "web", Shard: "gone"}}},
			DeleteDecision{Release: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, DecideDelete(tc.in))
		})
	}
}

func TestDeletedWithCluster(t *testing.T) {
	ref := func(kind string) metav1.OwnerReference { return metav1.OwnerReference{Kind: kind, Name: "x"} }
	for _, tc := range []struct {
		name     string
		owners   []metav1.OwnerReference
		capiLeft bool
		want     bool
	}{
		{"nothing owns it", nil, true, true},
		{"only the Cluster (the MachineDeployment template's shard group)", []metav1.OwnerReference{ref("Cluster")}, true, true},
		{"an on-demand pod only", []metav1.OwnerReference{ref("Pod")}, true, true},
		{"a pool's shard group", []metav1.OwnerReference{ref("NstanceMachinePool")}, true, false},
		{"a pool (its MachinePool deletes it)", []metav1.OwnerReference{ref("MachinePool")}, true, false},
		{"a Machine's NstanceMachine", []metav1.OwnerReference{ref("Pod"), ref("Machine")}, true, false},
		{"no MachinePool or Machine left: a pool's machine without a Machine", []metav1.OwnerReference{ref("NstanceMachinePool")}, false, true},
		{"no MachinePool or Machine left: anything", []metav1.OwnerReference{ref("Machine")}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, DeletedWithCluster(tc.owners, tc.capiLeft))
		})
	}
}
