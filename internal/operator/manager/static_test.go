package manager_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/importer"
	"github.com/nstance-dev/nstance/internal/operator/shardgroup"
	opwebhook "github.com/nstance-dev/nstance/internal/operator/webhook"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
)

// startStaticShard starts a fake shard whose config file defines the static
// group "edge" with two instances.
func startStaticShard(t *testing.T, f *fixture, id string) {
	t.Helper()
	cfg := shardtest.Config(clusterID, id, "mock")
	const none = `"groups": {},`
	require.Contains(t, cfg, none)
	cfg = strings.Replace(cfg, none, `"groups": {"`+tenant+`": {"edge": {"template": "worker", "size": 2}}},`, 1)
	sh := shardtest.Start(t, shardtest.Options{ClusterID: clusterID, ShardID: id, CA: f.ca, ConfigJSONC: cfg, Log: logr.Discard()})
	f.shards[id] = &fakeShard{t: t, id: id, ca: f.ca, sh: sh, proxy: newProxy(t, sh.OperatorAddr)}
}

// TestStaticGroupImported: a group defined in a shard's config file is
// imported as a static pool (annotated, its MachinePool labelled for the
// webhook) whose shard group mirrors the server without changing it;
// deleting the pool leaves the group on the server and is not undone by the
// next import.
func TestStaticGroupImported(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	startStaticShard(t, f, "shard-s")
	f.putNonce(t)
	r := startOperator(t, f.options(t))
	r.waitImported(t)
	require.Equal(t, []string{"edge"}, r.op.ImportResult.Imported)
	require.Equal(t, 1, r.op.ImportResult.Static)

	pool, ok := get(t, f.ns, "edge", &infrav1.NstanceMachinePool{})
	require.True(t, ok)
	require.True(t, opwebhook.IsStatic(pool))
	require.Equal(t, "true", pool.Annotations[importer.ImportedAnnotation])
	require.Equal(t, []string{"shard-s"}, pool.Spec.Shards)
	require.Equal(t, "worker", pool.Spec.Template)
	mp, ok := get(t, f.ns, "edge", &clusterv1.MachinePool{})
	require.True(t, ok)
	require.Equal(t, int32(2), *mp.Spec.Replicas)
	require.Equal(t, "true", mp.Labels[opwebhook.StaticLabel], "the MachinePool webhook selects it")

	// The shard group matches the static definition, so the operator never
	// asks the server for a change it would refuse.
	require.Eventually(t, func() bool {
		p, _ := get(t, f.ns, "edge", &infrav1.NstanceMachinePool{})
		return p.Status.Ready && len(p.Spec.ProviderIDList) == 2 && p.Status.Replicas == 2
	}, waitLong, tick, "the static pool reports the server's two instances")
	sg, ok := get(t, f.ns, infrav1.ShardGroupName("edge", "shard-s"), &infrav1.NstanceShardGroup{})
	require.True(t, ok)
	require.Equal(t, metav1.ConditionTrue, condition(sg.Status.Conditions, infrav1.ConfigValidCondition))
	g := f.shards["shard-s"].group(t, "edge")
	require.NotNil(t, g)
	require.True(t, g.GetStatic())
	require.EqualValues(t, 2, g.GetSpec().GetSize())

	// Deleting the pool stops mirroring the group; the server keeps it.
	require.NoError(t, env.Client.Delete(ctx, mp))
	require.NoError(t, env.Client.Delete(ctx, pool))
	require.Eventually(t, func() bool {
		_, pok := get(t, f.ns, "edge", &infrav1.NstanceMachinePool{})
		_, sok := get(t, f.ns, sg.Name, &infrav1.NstanceShardGroup{})
		return !pok && !sok
	}, waitLong, tick, "the pool and its shard group go without deleting the static group")
	require.True(t, slices.Equal(f.serverSizes(t, "edge", "shard-s"), [][2]int{{2, 2}}), "the static group still runs")
	require.Eventually(t, func() bool {
		return len(f.events(t, "NstanceShardGroup", sg.Name, shardgroup.EventStaticGroupKept)) > 0
	}, waitLong, tick, "an Event says the group stays on the server")

	r.stop()
	r = startOperator(t, f.options(t))
	r.waitImported(t)
	require.Empty(t, r.op.ImportResult.Imported, "a deleted static pool is not imported again")
}

// TestShardGroupWithoutPoolNotImported: the group of an NstanceShardGroup
// that no pool owns (as the machinedeployment cluster template declares
// one) is Kubernetes' already; a restart does not import it as a pool.
func TestShardGroupWithoutPoolNotImported(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "shard-a")
	f.putNonce(t)
	r := startOperator(t, f.options(t))
	r.waitImported(t)
	require.NoError(t, env.Client.Create(ctx, &infrav1.NstanceShardGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: infrav1.ShardGroupName("md-0", "shard-a")},
		Spec:       infrav1.NstanceShardGroupSpec{Group: "md-0", Shard: "shard-a", Size: 0, Template: "worker"},
	}))
	f.waitGroupOnShards(t, "md-0", "shard-a")
	r.stop()

	r = startOperator(t, f.options(t))
	r.waitImported(t)
	require.Empty(t, r.op.ImportResult.Imported)
	require.Equal(t, 1, r.op.ImportResult.Known)
	_, ok := get(t, f.ns, "md-0", &infrav1.NstanceMachinePool{})
	require.False(t, ok)
}
