package capicontract_test

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// poolMachines returns the Machines core CAPI keeps for the MachinePool
// name, by the name of the NstanceMachine each stands for.
func poolMachines(t *testing.T, ns, name string) map[string]clusterv1.Machine {
	t.Helper()
	var list clusterv1.MachineList
	require.NoError(t, env.Client.List(context.Background(), &list, client.InNamespace(ns),
		client.MatchingLabels{clusterv1.MachinePoolNameLabel: name, clusterv1.ClusterNameLabel: clusterID}))
	out := map[string]clusterv1.Machine{}
	for _, m := range list.Items {
		out[m.Spec.InfrastructureRef.Name] = m
	}
	return out
}

// groupInstances lists the active members of a group on the fake shard.
func groupInstances(t *testing.T, f *fixture, group string) map[string]*nstancev1.InstanceStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := f.shard.Client(t, tenant).ListInstances(ctx, &nstancev1.ListInstancesRequest{GroupIds: []string{group}})
	require.NoError(t, err)
	out := map[string]*nstancev1.InstanceStatus{}
	for _, inst := range resp.GetInstances() {
		out[inst.GetInstanceId()] = inst
	}
	return out
}

// TestMachinePoolMachines: an NstanceMachinePool opts into core CAPI's
// MachinePool Machines. For three instances the operator keeps three
// NstanceMachines and core CAPI creates three Machines, Running with the
// instances' Nodes. Deleting one Machine deletes exactly that instance and,
// as a MachineSet does, the pool keeps three replicas: the group replaces it. An instance
// the server removes by itself takes its NstanceMachine and Machine along,
// and its replacement gets new ones.
func TestMachinePoolMachines(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	bindCAPIWorkloadRole(t, f.ns)
	a := &acks{ids: map[string]int{}}
	f.opts.OnDrainAcknowledged = a.record
	startOperator(t, f.opts)
	logs := &capiLog{}
	startCAPI(t, f.ns, logs.logger())
	t.Cleanup(func() {
		if t.Failed() {
			for _, line := range logs.matching("rror") {
				t.Log(line)
			}
		}
	})
	stream := watchInstances(t, f.shard)
	key := func(name string) client.ObjectKey { return client.ObjectKey{Namespace: f.ns, Name: name} }
	f.createPool(t, "mpm", 3, 30*time.Second)

	// Every member has a Running Machine with a Node, and core CAPI's
	// MachinePool counts three.
	waitMachines := func(n int) map[string]clusterv1.Machine {
		t.Helper()
		var ms map[string]clusterv1.Machine
		var mp clusterv1.MachinePool
		require.Eventually(t, func() bool {
			ms = poolMachines(t, f.ns, "mpm")
			if len(ms) != n || len(groupInstances(t, f, "mpm")) != n {
				return false
			}
			for _, m := range ms {
				if m.Status.Phase != string(clusterv1.MachinePhaseRunning) || !m.Status.NodeRef.IsDefined() || !m.DeletionTimestamp.IsZero() {
					return false
				}
			}
			return get(t, key("mpm"), &mp) && ptr.Deref(mp.Status.Replicas, -1) == int32(n) && len(mp.Spec.ProviderIDList) == n
		}, waitLong, tick, "core CAPI keeps %d Running MachinePool Machines", n)
		return ms
	}
	machines := waitMachines(3)

	var nmp infrav1.NstanceMachinePool
	require.True(t, get(t, key("mpm"), &nmp))
	require.Equal(t, "NstanceMachine", nmp.Status.InfrastructureMachineKind)
	var mp clusterv1.MachinePool
	require.True(t, get(t, key("mpm"), &mp))
	members := groupInstances(t, f, "mpm")
	for name, m := range machines {
		inst, ok := members[name]
		require.True(t, ok, "NstanceMachine %s is named after a member instance", name)
		var nm infrav1.NstanceMachine
		require.True(t, get(t, key(name), &nm))
		require.Equal(t, name, nm.Annotations[infrav1.PoolInstanceAnnotation])
		require.Equal(t, "mpm", nm.Labels[clusterv1.MachinePoolNameLabel])
		require.Equal(t, clusterID, nm.Labels[clusterv1.ClusterNameLabel])
		require.True(t, slices.ContainsFunc(nm.OwnerReferences, func(r metav1.OwnerReference) bool {
			return r.Kind == "NstanceMachinePool" && r.UID == nmp.UID && !ptr.Deref(r.Controller, false)
		}), "owned by the pool")
		require.True(t, slices.ContainsFunc(nm.OwnerReferences, func(r metav1.OwnerReference) bool {
			return r.Kind == "Machine" && r.UID == m.UID && ptr.Deref(r.Controller, false)
		}), "controlled by its Machine")
		require.True(t, slices.ContainsFunc(m.OwnerReferences, func(r metav1.OwnerReference) bool {
			return r.Kind == "MachinePool" && r.UID == mp.UID
		}), "the Machine belongs to the MachinePool")
		require.Equal(t, inst.GetProviderId(), nm.Spec.ProviderID)
		require.Equal(t, inst.GetProviderId(), m.Spec.ProviderID)
		require.True(t, nm.Status.Ready)
		node, ok := nodeByProviderID(t, inst.GetProviderId())
		require.True(t, ok)
		require.Equal(t, node.Name, m.Status.NodeRef.Name)
	}
	creates, _ := f.provider.Counts()
	require.Equal(t, 3, creates, "the NstanceMachines created no instances")

	t.Run("deleting a Machine deletes exactly its instance and the group replaces it", func(t *testing.T) {
		names := slices.Sorted(maps.Keys(machines))
		victim, keep := names[1], []string{names[0], names[2]}
		m := machines[victim]
		require.NoError(t, env.Client.Delete(ctx, &m))
		require.Eventually(t, func() bool {
			return !get(t, key(victim), &clusterv1.Machine{}) && !get(t, key(victim), &infrav1.NstanceMachine{})
		}, drainWait, tick, "core CAPI deletes the Machine and its NstanceMachine")
		require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_DELETED, instanceState(t, f.shard, victim))
		// As a MachineSet replaces a deleted Machine, the pool keeps its
		// replicas: the group replaces the instance.
		after := waitMachines(3)
		_, stillThere := after[victim]
		require.False(t, stillThere)
		for _, id := range keep {
			_, ok := after[id]
			require.True(t, ok, "the other Machines stay")
			require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_RUNNING, instanceState(t, f.shard, id))
		}
		require.True(t, get(t, key("mpm"), &mp))
		require.Equal(t, int32(3), ptr.Deref(mp.Spec.Replicas, 0), "the MachinePool keeps its replicas")
		for k := range mp.Annotations {
			require.False(t, strings.HasPrefix(k, infrav1.ReleasedAnnotationPrefix), "no release record on the MachinePool")
		}
		creates, _ := f.provider.Counts()
		require.Equal(t, 4, creates, "the group replaced the removed instance")
		require.Empty(t, logs.matching("Skipping deletion of Kubernetes Node"))
		require.NotEmpty(t, events(t, f.ns, "Machine", victim, "SuccessfulDrainNode"), "core CAPI drained the Node")
		// No second drain: core CAPI drained the Node, so the server removed
		// the instance without announcing one.
		require.Eventually(t, func() bool {
			return slices.Contains(stream.of(victim), nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_DELETED)
		}, waitLong, tick)
		require.NotContains(t, stream.of(victim), nstancev1.InstanceEventStatus_INSTANCE_EVENT_STATUS_PENDING_DELETION)
		require.Zero(t, a.count(victim))
	})

	t.Run("an instance the server removes takes its NstanceMachine and Machine along", func(t *testing.T) {
		before := poolMachines(t, f.ns, "mpm")
		require.Len(t, before, 3)
		gone := slices.Sorted(maps.Keys(before))[0]
		_, err := f.shard.Client(t, tenant).DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: gone})
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			return !get(t, key(gone), &clusterv1.Machine{}) && !get(t, key(gone), &infrav1.NstanceMachine{})
		}, waitLong, tick, "the Machine and NstanceMachine of the removed instance go")
		after := waitMachines(3)
		_, stillThere := after[gone]
		require.False(t, stillThere)
		require.True(t, get(t, key("mpm"), &mp))
		require.Equal(t, int32(3), ptr.Deref(mp.Spec.Replicas, 0), "a server-side removal does not change the MachinePool")
		creates, _ := f.provider.Counts()
		require.Equal(t, 5, creates, "the group replaced the removed instance")
		require.Equal(t, 1, a.count(gone), "the operator drained it once")
		require.Empty(t, events(t, f.ns, "Machine", gone, "SuccessfulDrainNode"), "core CAPI did not drain again")
	})
}
