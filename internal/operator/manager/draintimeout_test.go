package manager_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// A shard group's drainTimeout of 0s reaches the server as 0 (no drain),
// not as unset: the server's group reads back a drain timeout of 0 (the
// server's deletion without drain is tested in internal/server/reconcile).
func TestShardGroupDrainTimeoutZeroReachesTheServer(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "shard-a")
	f.putNonce(t)
	r := startOperator(t, f.options(t))
	r.waitImported(t)
	cl := f.shards["shard-a"].client(t)
	sgName := infrav1.ShardGroupName("md-0", "shard-a")
	require.NoError(t, env.Client.Create(ctx, &infrav1.NstanceShardGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: sgName, Labels: map[string]string{clusterv1.ClusterNameLabel: clusterID}},
		Spec:       infrav1.NstanceShardGroupSpec{Group: "md-0", Shard: "shard-a", Size: 1, Template: "worker", DrainTimeout: &metav1.Duration{}},
	}))
	require.Eventually(t, func() bool {
		resp, err := cl.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
		require.NoError(t, err)
		for _, g := range resp.GetGroups() {
			if g.GetSpec().GetGroupId() == "md-0" {
				return g.GetSpec().GetDrainTimeout() != nil && g.GetSpec().GetDrainTimeout().AsDuration() == 0 && len(activeMembers(t, cl, "md-0")) == 1
			}
		}
		return false
	}, waitLong, tick, "the server's group has drain timeout 0 and its member")

}
