package shardtest_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nstance-dev/nstance/internal/server/shardtest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// BenchmarkConcurrentUpsertGroup: one tenant holds 1,000 groups on a shard
// (mock provider, size 0); 1,000 UpsertGroup calls, one per group (a var
// changes), are sent at once over the Operator API (mTLS on loopback, 8
// client connections) and the time until every call returned is measured,
// three rounds, reported as the median with p99 call latency. The calls
// are coalesced into few writes of the tenant's groups document (group
// commit), each returning only once its change is stored.
//
//	go test -run '^$' -bench ConcurrentUpsertGroup -benchtime 1x ./internal/server/shardtest/
func BenchmarkConcurrentUpsertGroup(b *testing.B) {
	const rounds, conns = 3, 8
	groups := benchEnvInt("NSTANCE_BENCH_GROUPS", 1000)
	cfg := strings.Replace(shardtest.Config("test-cluster", "test-1", "mock"), `"default_drain_timeout": "30s",`,
		`"default_drain_timeout": "30s", "limits": { "max_groups_per_tenant": 2000, "max_tenant_group_bytes": 4194304 },`, 1)
	sh := shardtest.Start(b, shardtest.Options{ConfigJSONC: cfg})
	clients := make([]nstancev1.OperatorServiceClient, conns)
	for i := range clients {
		clients[i] = sh.Client(b, "acme")
	}
	ctx := context.Background()
	upsert := func(c nstancev1.OperatorServiceClient, g, round int) error {
		_, err := c.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{
			GroupId: fmt.Sprintf("g%04d", g), Template: "worker", Size: 0, Vars: map[string]string{"round": fmt.Sprint(round)},
		}})
		return err
	}
	seeded := time.Now()
	for g := range groups {
		if err := upsert(clients[0], g, -1); err != nil {
			b.Fatalf("seeding group %d: %v", g, err)
		}
	}
	b.Logf("%d groups seeded one by one in %s", groups, time.Since(seeded).Round(time.Millisecond))
	var walls, p99s []time.Duration
	b.ResetTimer()
	for round := range rounds {
		lat := make([]time.Duration, groups)
		errs := make([]error, groups)
		var wg sync.WaitGroup
		start := time.Now()
		for g := range groups {
			wg.Go(func() {
				t0 := time.Now()
				errs[g] = upsert(clients[g%conns], g, round)
				lat[g] = time.Since(t0)
			})
		}
		wg.Wait()
		wall := time.Since(start)
		for g, err := range errs {
			if err != nil {
				b.Fatalf("round %d: group %d: %v", round, g, err)
			}
		}
		slices.Sort(lat)
		walls, p99s = append(walls, wall), append(p99s, quantile(lat, 0.99))
		b.Logf("round %d: %d concurrent UpsertGroup at %d groups: all returned after %s (p50 %s, p99 %s)", round, groups, groups,
			wall.Round(time.Millisecond), quantile(lat, 0.5).Round(time.Millisecond), quantile(lat, 0.99).Round(time.Millisecond))
	}
	b.StopTimer()
	b.ReportMetric(median(walls).Seconds(), "all-returned-s")
	b.ReportMetric(float64(median(p99s).Milliseconds()), "call-p99-ms")
}
