package manager_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// TestReplicaEditsReachTheServerInOrder: quick successive scale-ups of a
// MachinePool reach each shard as a rising series of group sizes ending at
// the last one. The pool reconciler sends a changed shard group at once
// (SyncNow) while the shard group controller may still hold an older copy
// in its cache; neither may send a size older than one already sent, so a
// fall in a shard's series means an older spec undid a newer one.
func TestReplicaEditsReachTheServerInOrder(t *testing.T) {
	f := newFixture(t, "shard-a", "shard-b")
	f.putNonce(t)
	var mu sync.Mutex
	sent := map[string][]uint32{} // shard address -> sizes of group "order"
	record := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(*nstancev1.UpsertGroupRequest); ok && r.GetGroup().GetGroupId() == "order" {
			mu.Lock()
			sent[cc.Target()] = append(sent[cc.Target()], r.GetGroup().GetSize())
			mu.Unlock()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	o := f.options(t)
	o.ShardDialOptions = []grpc.DialOption{grpc.WithChainUnaryInterceptor(record)}
	startOperator(t, o).waitImported(t)

	f.createPool(t, "order", 2, "shard-a", "shard-b")
	require.Eventually(t, func() bool {
		return slices.Equal(f.serverSizes(t, "order", "shard-a", "shard-b"), [][2]int{{1, 1}, {1, 1}})
	}, waitLong, tick)
	for replicas := int32(4); replicas <= 12; replicas += 2 {
		f.scale(t, "order", replicas)
	}
	require.Eventually(t, func() bool {
		return slices.Equal(f.serverSizes(t, "order", "shard-a", "shard-b"), [][2]int{{6, 6}, {6, 6}})
	}, waitLong, tick)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, sent, 2, "UpsertGroup calls by shard: %v", sent)
	for shard, sizes := range sent {
		t.Logf("shard %s: UpsertGroup sizes %v", shard, sizes)
		require.True(t, slices.IsSorted(sizes), "shard %s: an older size was sent after a newer one: %v", shard, sizes)
		require.Len(t, slices.Compact(slices.Clone(sizes)), len(sizes), "shard %s: a size was sent twice: %v", shard, sizes)
		require.Equal(t, uint32(6), sizes[len(sizes)-1], "shard %s: %v", shard, sizes)
	}
}
