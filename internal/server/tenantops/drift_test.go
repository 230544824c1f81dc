package tenantops_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/shardtest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// TestDrifted runs a real in-process shard: after the template's instance
// type changes in the live config, a group member (its rotation paused) and
// an on-demand instance that took the template's type report drifted; an
// on-demand instance that named its type itself does not.
func TestDrifted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sh := shardtest.Start(t, shardtest.Options{ClusterID: "drift", ShardID: "s1", Log: logr.Discard()})
	c := sh.Client(t, "default")

	_, err := c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "web", Template: "worker", Size: 1,
		Rollout: &nstancev1.RolloutStrategy{Paused: true}}})
	require.NoError(t, err)
	plain, err := c.CreateInstance(ctx, &nstancev1.CreateInstanceRequest{Template: "worker", ClientToken: "plain"})
	require.NoError(t, err)
	pinned, err := c.CreateInstance(ctx, &nstancev1.CreateInstanceRequest{Template: "worker", InstanceType: "test.small", ClientToken: "pinned"})
	require.NoError(t, err)

	status := func(id string) *nstancev1.InstanceStatus {
		resp, err := c.GetInstanceStatus(ctx, &nstancev1.GetInstanceStatusRequest{Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: id}})
		require.NoError(t, err)
		return resp.GetInstance()
	}
	var member string
	require.Eventually(t, func() bool {
		resp, err := c.ListInstances(ctx, &nstancev1.ListInstancesRequest{GroupIds: []string{"web"}})
		require.NoError(t, err)
		for _, i := range resp.GetInstances() {
			if i.GetClientToken() == "" {
				member = i.GetInstanceId()
			}
		}
		return member != ""
	}, 30*time.Second, 50*time.Millisecond, "group member")
	for _, id := range []string{member, plain.GetInstance().GetInstanceId(), pinned.GetInstance().GetInstanceId()} {
		require.False(t, status(id).GetDrifted(), "before the change: %s", id)
	}

	cur := sh.Config.Current()
	next := *cur
	next.Templates = maps.Clone(cur.Templates)
	w := next.Templates["worker"]
	w.InstanceType = "test.large"
	next.Templates["worker"] = w
	sh.Config.Set(&next, "drift-test", time.Now())

	require.True(t, status(member).GetDrifted(), "group member")
	require.True(t, status(plain.GetInstance().GetInstanceId()).GetDrifted(), "on-demand instance with the template's type")
	require.False(t, status(pinned.GetInstance().GetInstanceId()).GetDrifted(), "on-demand instance that named its type")
	resp, err := c.ListInstances(ctx, &nstancev1.ListInstancesRequest{})
	require.NoError(t, err)
	drifted := map[string]bool{}
	for _, i := range resp.GetInstances() {
		drifted[i.GetInstanceId()] = i.GetDrifted()
	}
	require.Equal(t, map[string]bool{member: true, plain.GetInstance().GetInstanceId(): true, pinned.GetInstance().GetInstanceId(): false}, drifted)
}
