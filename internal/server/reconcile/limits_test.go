package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/tenantops"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func entries(n int) map[string]string {
	m := map[string]string{}
	for i := 0; i < n; i++ {
		m[fmt.Sprint("k", i)] = "v"
	}
	return m
}

func TestGroupsPerTenantQuota(t *testing.T) {
	s := newShard(t, newShardConfig(t).limits(func(l *config.Limits) { l.MaxGroupsPerTenant = 3 }).build(t), shardOptions{})
	ctx := context.Background()
	// Concurrent creates cannot overshoot: the count is taken on the stored document.
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = s.ops.UpsertGroup(ctx, "t", &nstancev1.GroupSpec{GroupId: fmt.Sprint("g", i), Template: "worker"}, "")
		}()
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		if err == nil {
			ok++
			continue
		}
		require.ErrorIs(t, err, tenantops.ErrQuota)
		require.Contains(t, err.Error(), "tenant t already has 3 dynamic groups (shard.limits.max_groups_per_tenant)")
	}
	require.Equal(t, 3, ok)
	require.Len(t, s.ops.ListGroups("t"), 3)
	// Updating an existing group is still allowed; another tenant has its own quota.
	g := s.ops.ListGroups("t")[0].GetSpec()
	g.Size = 0
	_, created, err := s.ops.UpsertGroup(ctx, "t", g, "")
	require.NoError(t, err)
	require.False(t, created)
	_, _, err = s.ops.UpsertGroup(ctx, "other", &nstancev1.GroupSpec{GroupId: "g", Template: "worker"}, "")
	require.NoError(t, err)
	// Deleting one makes room.
	_, err = s.ops.DeleteGroup(ctx, "t", g.GetGroupId(), "")
	require.NoError(t, err)
	_, _, err = s.ops.UpsertGroup(ctx, "t", &nstancev1.GroupSpec{GroupId: "late", Template: "worker"}, "")
	require.NoError(t, err)
}

func TestVarsAndLabelsQuota(t *testing.T) {
	s := newShard(t, newShardConfig(t).limits(func(l *config.Limits) { l.MaxVars, l.MaxLabels = 4, 2 }).build(t), shardOptions{})
	ctx := context.Background()
	_, _, err := s.ops.UpsertGroup(ctx, "t", &nstancev1.GroupSpec{GroupId: "g", Template: "worker", Vars: entries(5)}, "")
	var inv *tenantops.InvalidError
	require.ErrorAs(t, err, &inv)
	require.Contains(t, err.Error(), "vars: 5 entries, more than shard.limits.max_vars (4)")
	_, _, err = s.ops.UpsertGroup(ctx, "t", &nstancev1.GroupSpec{GroupId: "g", Template: "worker", Labels: entries(3)}, "")
	require.ErrorAs(t, err, &inv)
	require.Contains(t, err.Error(), "labels: 3 entries, more than shard.limits.max_labels (2)")
	_, _, err = s.ops.UpsertGroup(ctx, "t", &nstancev1.GroupSpec{GroupId: "g", Template: "worker", Vars: entries(3), Labels: entries(2)}, "")
	require.NoError(t, err)
	// An on-demand instance counts its group's entries plus its own.
	_, err = s.ops.CreateInstance(ctx, "t", tenantops.CreateInstanceRequest{GroupID: "g", Vars: map[string]string{"x": "1", "y": "2"}})
	require.ErrorAs(t, err, &inv)
	require.Contains(t, err.Error(), "vars: 5 entries")
	_, err = s.ops.CreateInstance(ctx, "t", tenantops.CreateInstanceRequest{GroupID: "g", Labels: map[string]string{"z": "1"}})
	require.ErrorAs(t, err, &inv)
	require.Contains(t, err.Error(), "labels: 3 entries")
	_, err = s.ops.CreateInstance(ctx, "t", tenantops.CreateInstanceRequest{GroupID: "g", Vars: map[string]string{"k0": "override"}})
	require.NoError(t, err)
	require.Equal(t, 1, s.insts.Len(), "only the accepted request made a record")
}

func TestTenantCreateRateRefusesOnDemandBeyondBurst(t *testing.T) {
	// 1 a minute: nothing refills during the test.
	s := newShard(t, newShardConfig(t).limits(func(l *config.Limits) { l.TenantCreateRate = config.RateLimit{PerMinute: 1, Burst: 3} }).build(t), shardOptions{})
	ctx := context.Background()
	var refused []error
	for i := 0; i < 10; i++ {
		_, err := s.ops.CreateInstance(ctx, "t", tenantops.CreateInstanceRequest{Template: "worker", ClientToken: fmt.Sprint("tok", i)})
		if err != nil {
			refused = append(refused, err)
		}
	}
	require.Len(t, refused, 7)
	for _, err := range refused {
		require.ErrorIs(t, err, tenantops.ErrQuota)
		require.Contains(t, err.Error(), "tenant t creates instances faster than shard.limits.tenant_create_rate (1 a minute, bursts of 3)")
	}
	require.Equal(t, 3, s.insts.Len(), "refused requests leave no record")
	// A repeated client token answers the first result without being charged.
	rec, err := s.ops.CreateInstance(ctx, "t", tenantops.CreateInstanceRequest{Template: "worker", ClientToken: "tok0"})
	require.NoError(t, err)
	require.NotEmpty(t, rec.ID)
	// Another tenant has its own bucket.
	_, err = s.ops.CreateInstance(ctx, "u", tenantops.CreateInstanceRequest{Template: "worker"})
	require.NoError(t, err)
	require.False(t, errors.Is(err, tenantops.ErrQuota))
}

func TestTenantCreateRatePacesGroupScaleUp(t *testing.T) {
	// Burst 2, then 2 a second; the shard-wide create rate is unlimited here.
	s := newShard(t, newShardConfig(t).limits(func(l *config.Limits) { l.TenantCreateRate = config.RateLimit{PerMinute: 120, Burst: 2} }).build(t), shardOptions{})
	s.upsert(t, "web", 5, 0)
	require.Equal(t, 2, s.insts.Len(), "the burst")
	for want := 3; want <= 5; want++ {
		s.advance(t, 499*time.Millisecond)
		require.Equal(t, want-1, s.insts.Len(), "1ms before the tenant's next token")
		s.advance(t, time.Millisecond)
		require.Equal(t, want, s.insts.Len())
	}
	require.Len(t, s.running("web"), 5)
}

func TestVarAndLabelLengthsAndTenantGroupBytes(t *testing.T) {
	s := newShard(t, newShardConfig(t).limits(func(l *config.Limits) {
		l.MaxVarValueBytes, l.MaxLabelKeyBytes, l.MaxTenantGroupBytes = 100, 10, 4096
	}).build(t), shardOptions{})
	ctx := context.Background()
	var inv *tenantops.InvalidError
	_, _, err := s.ops.UpsertGroup(ctx, "t", &nstancev1.GroupSpec{GroupId: "g", Template: "worker", Vars: map[string]string{"blob": strings.Repeat("x", 101)}}, "")
	require.ErrorAs(t, err, &inv)
	require.Contains(t, err.Error(), `vars: var "blob": value of 101 bytes, more than shard.limits.max_var_value_bytes (100)`)
	require.Empty(t, s.ops.ListGroups("t"), "nothing stored")
	// On demand: the instance's own labels are measured too; no record is made.
	_, err = s.ops.CreateInstance(ctx, "t", tenantops.CreateInstanceRequest{Template: "worker", Labels: map[string]string{"team.example/x": "1"}})
	require.ErrorAs(t, err, &inv)
	require.Contains(t, err.Error(), `labels: label name "team.example/x"... of 14 bytes, more than shard.limits.max_label_key_bytes (10)`)
	_, err = s.ops.CreateInstance(ctx, "t", tenantops.CreateInstanceRequest{Template: "worker", Vars: map[string]string{"blob": strings.Repeat("x", 101)}})
	require.ErrorAs(t, err, &inv)
	require.Equal(t, 0, s.insts.Len(), "refused requests leave no record")

	// 100-byte values, 10 vars: about 1.3 KiB a group; the fourth is beyond 4 KiB.
	vars := map[string]string{}
	for i := range 10 {
		vars[fmt.Sprint("v", i)] = strings.Repeat("v", 100)
	}
	var quota error
	for i := range 5 {
		_, _, err := s.ops.UpsertGroup(ctx, "t", &nstancev1.GroupSpec{GroupId: fmt.Sprint("g", i), Template: "worker", Vars: vars}, "")
		if err != nil {
			quota = err
			require.Equal(t, 3, i)
			break
		}
	}
	require.ErrorIs(t, quota, tenantops.ErrQuota)
	require.Contains(t, quota.Error(), "group g3 of tenant t takes")
	require.Contains(t, quota.Error(), "shard.limits.max_tenant_group_bytes (4096)")
	require.Len(t, s.ops.ListGroups("t"), 3)
	// Another tenant has its own.
	_, _, err = s.ops.UpsertGroup(ctx, "u", &nstancev1.GroupSpec{GroupId: "g0", Template: "worker", Vars: vars}, "")
	require.NoError(t, err)
}
