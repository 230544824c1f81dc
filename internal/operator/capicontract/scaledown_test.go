package capicontract_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	opconfig "github.com/nstance-dev/nstance/internal/operator/config"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

const (
	shardB = "shard-b"
	// caTaint is the taint cluster-autoscaler puts on a Node it removes.
	caTaint = "ToBeDeletedByClusterAutoscaler"
)

// addShard starts a second fake shard of the fixture's cluster, with the
// Node-registering mock provider, and adds it to the operator's config.
func (f *fixture) addShard(t *testing.T, id string) *shardtest.Shard {
	t.Helper()
	sh := shardtest.Start(t, shardtest.Options{ClusterID: clusterID, ShardID: id, CA: f.ca,
		Provider: &nodeProvider{Provider: mock.New(), c: env.Client}, Log: logr.Discard()})
	f.opts.Config.Shards[id] = opconfig.Shard{RegistrationAddr: f.opts.Config.Shards[shardID].RegistrationAddr, OperatorAddr: sh.OperatorAddr}
	return sh
}

// groupState is the size cl's server holds for group and its active
// members; ok is false while the server cannot be asked.
func groupState(t *testing.T, cl nstancev1.OperatorServiceClient, group string) (size uint32, members []string, ok bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	groups, err := cl.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
	if err != nil {
		t.Logf("ListGroups: %v", err)
		return 0, nil, false
	}
	for _, g := range groups.GetGroups() {
		if g.GetSpec().GetGroupId() == group {
			size = g.GetSpec().GetSize()
		}
	}
	insts, err := cl.ListInstances(ctx, &nstancev1.ListInstancesRequest{GroupIds: []string{group}})
	if err != nil {
		t.Logf("ListInstances: %v", err)
		return 0, nil, false
	}
	for _, inst := range insts.GetInstances() {
		members = append(members, inst.GetInstanceId())
	}
	return size, members, true
}

// scaleMachinePool sets the MachinePool's replicas through its scale
// subresource, as cluster-autoscaler does.
func scaleMachinePool(t *testing.T, ns, name string, replicas int32) {
	t.Helper()
	ctx := context.Background()
	require.Eventually(t, func() bool {
		mp := &clusterv1.MachinePool{}
		if !get(t, client.ObjectKey{Namespace: ns, Name: name}, mp) {
			return false
		}
		sc := &autoscalingv1.Scale{}
		if err := env.Client.SubResource("scale").Get(ctx, mp, sc); err != nil {
			t.Logf("get scale: %v", err)
			return false
		}
		sc.Spec.Replicas = replicas
		if err := env.Client.SubResource("scale").Update(ctx, mp, client.WithSubResourceBody(sc)); err != nil {
			t.Logf("update scale: %v", err)
			return false
		}
		return true
	}, waitLong, tick, "scale MachinePool %s to %d", name, replicas)
}

// TestScaleDownRemovesTheChosenMachine is the acceptance line:
// cluster-autoscaler's protocol, step by step, on a 4-replica pool over two
// shards, ten times. The autoscaler taints and cordons the Node it chose
// (drain: no pods here), annotates its Machine with delete-machine and
// lowers the MachinePool through the scale subresource. Exactly that
// instance goes, no other Node is cordoned, tainted or drained, and the
// shard of the victim is the one that shrinks (2/1 or 1/2). Scaling back
// to four grows the shard with fewer members.
func TestScaleDownRemovesTheChosenMachine(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	shards := map[string]*shardtest.Shard{shardID: f.shard, shardB: f.addShard(t, shardB)}
	clients := map[string]nstancev1.OperatorServiceClient{}
	for id, sh := range shards {
		clients[id] = sh.Client(t, tenant)
	}
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
	const pool = "ca"
	key := func(name string) client.ObjectKey { return client.ObjectKey{Namespace: f.ns, Name: name} }
	f.createPoolOn(t, pool, 4, 30*time.Second, shardID, shardB)

	// members: instance id -> shard, once every instance has a Running
	// Machine with its Node and the server groups are at want.
	waitPool := func(want map[string]uint32) map[string]string {
		t.Helper()
		var members map[string]string
		var total uint32
		for _, n := range want {
			total += n
		}
		require.Eventually(t, func() bool {
			members = map[string]string{}
			for id, cl := range clients {
				size, ids, ok := groupState(t, cl, pool)
				if !ok || size != want[id] || uint32(len(ids)) != want[id] {
					return false
				}
				for _, iid := range ids {
					members[iid] = id
				}
			}
			ms := poolMachines(t, f.ns, pool)
			if len(ms) != int(total) {
				return false
			}
			for name, m := range ms {
				if _, ok := members[name]; !ok || m.Status.Phase != string(clusterv1.MachinePhaseRunning) || !m.Status.NodeRef.IsDefined() || !m.DeletionTimestamp.IsZero() {
					return false
				}
			}
			var mp clusterv1.MachinePool
			return get(t, key(pool), &mp) && ptr.Deref(mp.Status.Replicas, -1) == int32(total)
		}, waitLong, tick, "the pool has %v Running members", want)
		return members
	}
	members := waitPool(map[string]uint32{shardID: 2, shardB: 2})

	for run := range 10 {
		// Alternate the shards and, within one, the member.
		victimShard := []string{shardID, shardB}[run%2]
		var onShard []string
		for id, sh := range members {
			if sh == victimShard {
				onShard = append(onShard, id)
			}
		}
		slices.Sort(onShard)
		victim := onShard[(run/2)%len(onShard)]
		others := slices.DeleteFunc(slices.Collect(maps.Keys(members)), func(id string) bool { return id == victim })
		t.Logf("run %d: victim %s on %s", run, victim, victimShard)

		// cluster-autoscaler: taint and cordon the chosen Node (its drain
		// has no pods to evict), annotate its Machine, lower the pool.
		m := poolMachines(t, f.ns, pool)[victim]
		var node corev1.Node
		require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Name: m.Status.NodeRef.Name}, &node))
		np := client.MergeFrom(node.DeepCopy())
		node.Spec.Unschedulable = true
		node.Spec.Taints = append(node.Spec.Taints, corev1.Taint{Key: caTaint, Value: fmt.Sprint(time.Now().Unix()), Effect: corev1.TaintEffectNoSchedule})
		require.NoError(t, env.Client.Patch(ctx, &node, np))
		mpatch := client.MergeFrom(m.DeepCopy())
		if m.Annotations == nil {
			m.Annotations = map[string]string{}
		}
		m.Annotations[clusterv1.DeleteMachineAnnotation] = time.Now().UTC().Format(time.RFC3339)
		require.NoError(t, env.Client.Patch(ctx, &m, mpatch))
		scaleMachinePool(t, f.ns, pool, 3)

		want := map[string]uint32{shardID: 2, shardB: 2}
		want[victimShard] = 1
		left := waitPool(want)
		require.ElementsMatch(t, others, slices.Collect(maps.Keys(left)), "run %d: exactly the chosen instance went", run)
		require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_DELETED, instanceState(t, shards[victimShard], victim))
		require.Eventually(t, func() bool { return !get(t, key(victim), &clusterv1.Machine{}) }, waitLong, tick, "the victim's Machine goes")
		for _, id := range others {
			require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_RUNNING, instanceState(t, shards[left[id]], id))
			n, ok := nodeByProviderID(t, poolMachines(t, f.ns, pool)[id].Spec.ProviderID)
			require.True(t, ok)
			require.False(t, n.Spec.Unschedulable, "run %d: Node %s was not chosen and is not cordoned", run, n.Name)
			require.False(t, slices.ContainsFunc(n.Spec.Taints, func(tn corev1.Taint) bool {
				return tn.Key == caTaint || tn.Key == corev1.TaintNodeUnschedulable
			}), "run %d: Node %s was not chosen and is not tainted: %v", run, n.Name, n.Spec.Taints)
			require.Zero(t, a.count(id), "run %d: Node of %s was not chosen and is not drained", run, id)
			require.Empty(t, events(t, f.ns, "Machine", id, "SuccessfulDrainNode"), "run %d: core CAPI drained no other Node", run)
		}

		// Back to four: the shard that lost its member grows.
		scaleMachinePool(t, f.ns, pool, 4)
		members = waitPool(map[string]uint32{shardID: 2, shardB: 2})
		for _, id := range others {
			require.Equal(t, left[id], members[id], "run %d: the remaining members stay", run)
		}
	}
}
