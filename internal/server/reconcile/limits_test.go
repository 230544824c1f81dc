package reconcile_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/reconcile"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func limitsEdit(limits string) func(string) string {
	return shardEdit(`"limits": {` + limits + `},`)
}

func entries(n int) map[string]string {
	m := map[string]string{}
	for i := 0; i < n; i++ {
		m[fmt.Sprint("k", i)] = "v"
	}
	return m
}

func TestGroupsPerTenantQuota(t *testing.T) {
	e := start(t, limitsEdit(`"max_groups_per_tenant": 3`), nil)
	ctx := context.Background()
	// Concurrent creates cannot overshoot: the count is taken on the stored document.
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = e.f.Reconciler.UpsertGroup(ctx, "t", &nstancev1.GroupSpec{GroupId: fmt.Sprint("g", i), Template: "worker"}, "")
		}()
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		if err == nil {
			ok++
			continue
		}
		require.ErrorIs(t, err, reconcile.ErrQuota)
		require.Contains(t, err.Error(), "tenant t already has 3 dynamic groups (shard.limits.max_groups_per_tenant)")
	}
	require.Equal(t, 3, ok)
	require.Len(t, e.f.Reconciler.ListGroups("t"), 3)
	// Updating an existing group is still allowed; another tenant has its own quota.
	g := e.f.Reconciler.ListGroups("t")[0].GetSpec()
	g.Size = 0
	_, created, err := e.f.Reconciler.UpsertGroup(ctx, "t", g, "")
	require.NoError(t, err)
	require.False(t, created)
	_, _, err = e.f.Reconciler.UpsertGroup(ctx, "other", &nstancev1.GroupSpec{GroupId: "g", Template: "worker"}, "")
	require.NoError(t, err)
	// Deleting one makes room.
	_, err = e.f.Reconciler.DeleteGroup(ctx, "t", g.GetGroupId(), "")
	require.NoError(t, err)
	_, _, err = e.f.Reconciler.UpsertGroup(ctx, "t", &nstancev1.GroupSpec{GroupId: "late", Template: "worker"}, "")
	require.NoError(t, err)
}

func TestVarsAndLabelsQuota(t *testing.T) {
	e := start(t, limitsEdit(`"max_vars": 4, "max_labels": 2`), nil)
	ctx := context.Background()
	_, _, err := e.f.Reconciler.UpsertGroup(ctx, "t", &nstancev1.GroupSpec{GroupId: "g", Template: "worker", Vars: entries(5)}, "")
	var inv *reconcile.InvalidError
	require.ErrorAs(t, err, &inv)
	require.Contains(t, err.Error(), "vars: 5 entries, more than shard.limits.max_vars (4)")
	_, _, err = e.f.Reconciler.UpsertGroup(ctx, "t", &nstancev1.GroupSpec{GroupId: "g", Template: "worker", Labels: entries(3)}, "")
	require.ErrorAs(t, err, &inv)
	require.Contains(t, err.Error(), "labels: 3 entries, more than shard.limits.max_labels (2)")
	_, _, err = e.f.Reconciler.UpsertGroup(ctx, "t", &nstancev1.GroupSpec{GroupId: "g", Template: "worker", Vars: entries(3), Labels: entries(2)}, "")
	require.NoError(t, err)
	// An on-demand instance counts its group's entries plus its own.
	_, err = e.f.Reconciler.CreateInstance(ctx, "t", reconcile.CreateInstanceRequest{GroupID: "g", Vars: map[string]string{"x": "1", "y": "2"}})
	require.ErrorAs(t, err, &inv)
	require.Contains(t, err.Error(), "vars: 5 entries")
	_, err = e.f.Reconciler.CreateInstance(ctx, "t", reconcile.CreateInstanceRequest{GroupID: "g", Labels: map[string]string{"z": "1"}})
	require.ErrorAs(t, err, &inv)
	require.Contains(t, err.Error(), "labels: 3 entries")
	_, err = e.f.Reconciler.CreateInstance(ctx, "t", reconcile.CreateInstanceRequest{GroupID: "g", Vars: map[string]string{"k0": "override"}})
	require.NoError(t, err)
	require.Equal(t, 1, e.f.Instances.Len(), "only the accepted request made a record")
}

func TestTenantCreateRateRefusesOnDemandBeyondBurst(t *testing.T) {
	// 1 a minute: nothing refills during the test.
	e := start(t, limitsEdit(`"tenant_create_rate": {"per_minute": 1, "burst": 3}`), nil)
	ctx := context.Background()
	var refused []error
	for i := 0; i < 10; i++ {
		_, err := e.f.Reconciler.CreateInstance(ctx, "t", reconcile.CreateInstanceRequest{Template: "worker", ClientToken: fmt.Sprint("tok", i)})
		if err != nil {
			refused = append(refused, err)
		}
	}
	require.Len(t, refused, 7)
	for _, err := range refused {
		require.ErrorIs(t, err, reconcile.ErrQuota)
		require.Contains(t, err.Error(), "tenant t creates instances faster than shard.limits.tenant_create_rate (1 a minute, bursts of 3)")
	}
	require.Equal(t, 3, e.f.Instances.Len(), "refused requests leave no record")
	// A repeated client token answers the first result without being charged.
	rec, err := e.f.Reconciler.CreateInstance(ctx, "t", reconcile.CreateInstanceRequest{Template: "worker", ClientToken: "tok0"})
	require.NoError(t, err)
	require.NotEmpty(t, rec.ID)
	// Another tenant has its own bucket.
	_, err = e.f.Reconciler.CreateInstance(ctx, "u", reconcile.CreateInstanceRequest{Template: "worker"})
	require.NoError(t, err)
	require.False(t, errors.Is(err, reconcile.ErrQuota))
}

func TestTenantCreateRatePacesGroupScaleUp(t *testing.T) {
	// Burst 2, then 2 a second: a group of 5 needs at least 1.5s, and the
	// shard-wide create rate is unlimited here.
	e := start(t, limitsEdit(`"tenant_create_rate": {"per_minute": 120, "burst": 2}`), nil)
	began := time.Now()
	upsert(t, e, "web", 5, 0)
	var over []string
	require.Eventually(t, func() bool {
		n := e.f.Instances.Len()
		elapsed := time.Since(began)
		if allowed := 2 + int(elapsed/(500*time.Millisecond)); n > allowed {
			over = append(over, fmt.Sprintf("%d creates after %s (at most %d)", n, elapsed, allowed))
		}
		return len(running(e, "web")) == 5
	}, 10*time.Second, 10*time.Millisecond)
	require.Empty(t, over)
	require.GreaterOrEqual(t, time.Since(began), 1400*time.Millisecond)
}
