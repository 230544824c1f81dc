package manager_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/watchfilter"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// TestWatchFilter: with --watch-filter=tenant-a the operator reconciles only
// the pools labelled with it, labels the shard groups and Machines it makes
// for them and the pools it imports, and leaves an unlabelled pool and a
// pool of another filter value alone.
func TestWatchFilter(t *testing.T) {
	f := newFixture(t, "shard-a")
	f.putNonce(t)
	ctx := context.Background()
	_, err := f.shards["shard-a"].client(t).UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{
		GroupId: "legacy", Template: "worker", Size: 1,
	}})
	require.NoError(t, err)

	opts := f.options(t)
	opts.WatchFilter = "tenant-a"
	r := startOperator(t, opts)
	r.waitImported(t)
	require.Equal(t, []string{"legacy"}, r.op.ImportResult.Imported)
	for _, obj := range []client.Object{&infrav1.NstanceMachinePool{}, &clusterv1.MachinePool{}} {
		got, ok := get(t, f.ns, "legacy", obj)
		require.True(t, ok)
		require.Equal(t, "tenant-a", got.GetLabels()[watchfilter.Label], "imported %T carries the filter label", obj)
	}

	// Created before the labelled pool: had the filter let them through,
	// they would have been reconciled first.
	f.createPool(t, "theirs", 1, "shard-a")
	f.createPool(t, "other", 1, "shard-a")
	label(t, f.ns, "other", "tenant-b")
	f.createPool(t, "mine", 1, "shard-a")
	label(t, f.ns, "mine", "tenant-a")

	require.Eventually(t, func() bool {
		p, _ := get(t, f.ns, "mine", &infrav1.NstanceMachinePool{})
		return p.Status.Ready && len(p.Spec.ProviderIDList) == 1
	}, waitLong, tick, "the labelled pool is reconciled")
	require.Eventually(t, func() bool {
		l, _ := get(t, f.ns, "legacy", &infrav1.NstanceMachinePool{})
		return l.Status.Ready
	}, waitLong, tick, "the imported pool is reconciled")
	sg, ok := get(t, f.ns, "mine--shard-a", &infrav1.NstanceShardGroup{})
	require.True(t, ok)
	require.Equal(t, "tenant-a", sg.Labels[watchfilter.Label], "a pool's shard group inherits its label")
	var machines infrav1.NstanceMachineList
	require.Eventually(t, func() bool {
		require.NoError(t, env.Client.List(ctx, &machines, client.InNamespace(f.ns), client.MatchingLabels{infrav1.GroupLabel: "mine"}))
		return len(machines.Items) == 1
	}, waitLong, tick, "the pool's instance has its NstanceMachine")
	require.Equal(t, "tenant-a", machines.Items[0].Labels[watchfilter.Label], "and so do its NstanceMachines")

	for _, name := range []string{"theirs", "other"} {
		p, _ := get(t, f.ns, name, &infrav1.NstanceMachinePool{})
		require.Empty(t, p.Finalizers, "pool %s is not this operator's", name)
		require.Empty(t, p.Status.Conditions, "pool %s has no status from this operator", name)
		_, ok := get(t, f.ns, infrav1.ShardGroupName(name, "shard-a"), &infrav1.NstanceShardGroup{})
		require.False(t, ok, "no shard group for pool %s", name)
		require.Equal(t, -1, f.serverSizes(t, name, "shard-a")[0][0], "no server group for pool %s", name)
	}
	require.Equal(t, [][2]int{{1, 1}}, f.serverSizes(t, "mine", "shard-a"))
}

func label(t *testing.T, ns, name, value string) {
	t.Helper()
	require.Eventually(t, func() bool {
		p, ok := get(t, ns, name, &infrav1.NstanceMachinePool{})
		if !ok {
			return false
		}
		p.Labels = map[string]string{watchfilter.Label: value}
		return env.Client.Update(context.Background(), p) == nil
	}, waitLong, tick)
}
