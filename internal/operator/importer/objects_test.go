package importer

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nstance-dev/nstance/internal/operator/machinepool"
	"github.com/nstance-dev/nstance/internal/operator/webhook"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func TestObjects(t *testing.T) {
	spec := func(size uint32) *nstancev1.GroupSpec {
		return &nstancev1.GroupSpec{GroupId: "web", Template: "worker", Size: size, InstanceType: "m", SubnetPool: "p",
			Vars: map[string]string{"k": "v"}, DrainTimeout: durationpb.New(time.Minute)}
	}
	groups := []*nstancev1.GroupStatus{
		{Spec: spec(1), Shard: "a"},
		{Spec: spec(3), Shard: "c"},
		{Spec: spec(2), Shard: "b"},
	}
	pool, mp := Objects("ns", "prod", "web", groups)
	require.Equal(t, []string{"c", "b", "a"}, pool.Spec.Shards, "largest first")
	require.Equal(t, int32(6), *mp.Spec.Replicas)
	require.Equal(t, "worker", pool.Spec.Template)
	require.Equal(t, time.Minute, pool.Spec.DrainTimeout.Duration)
	require.Equal(t, "prod", mp.Spec.ClusterName)
	require.Equal(t, "web", mp.Spec.Template.Spec.InfrastructureRef.Name)
	require.Equal(t, "true", pool.Annotations[ImportedAnnotation])
	require.False(t, webhook.IsStatic(pool), "a dynamic group is not static")
	require.NotContains(t, mp.Annotations, webhook.StaticAnnotation)
	require.NotContains(t, mp.Labels, webhook.StaticLabel)
	// The split of the imported total reproduces sizes that differ by one.
	pool2, mp2 := Objects("ns", "prod", "web", []*nstancev1.GroupStatus{{Spec: spec(1), Shard: "a"}, {Spec: spec(2), Shard: "b"}})
	split := machinepool.SplitReplicas(*mp2.Spec.Replicas, pool2.Spec.Shards)
	require.Equal(t, map[string]int32{"a": 1, "b": 2}, split)
}

// TestObjectsStatic: a group defined in a shard's config file is imported
// as a static pool, the annotation the webhook keys on.
func TestObjectsStatic(t *testing.T) {
	groups := []*nstancev1.GroupStatus{{Spec: &nstancev1.GroupSpec{GroupId: "edge", Template: "worker", Size: 2}, Shard: "a", Static: true}}
	pool, mp := Objects("ns", "prod", "edge", groups)
	require.True(t, webhook.IsStatic(pool))
	require.Equal(t, "true", pool.Annotations[ImportedAnnotation])
	require.Equal(t, "true", mp.Annotations[webhook.StaticAnnotation])
	require.Equal(t, "true", mp.Labels[webhook.StaticLabel], "the label the MachinePool webhook selects on")
	require.Equal(t, int32(2), *mp.Spec.Replicas)
	require.Equal(t, []string{"a"}, pool.Spec.Shards)
}
