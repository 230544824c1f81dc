package reconcile_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/provider"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// TestNoHealthVerdictsDuringReconnectGrace: a new leader takes over running
// instances whose agents were connected to the old one. Until
// shard.agent_reconnect_grace has passed since the term started, no instance
// of the earlier term is judged: not the ones that have not reconnected yet
// (the startup grace, measured from their creation, is long over) and not
// one that reported once and then missed reports. Afterwards both are
// judged as usual and an agent that keeps reporting is never touched.
func TestNoHealthVerdictsDuringReconnectGrace(t *testing.T) {
	const grace = 5 * time.Second
	cfg := newShardConfig(t).health(100*time.Millisecond, 3, time.Second)
	cfg.c.Shard.AgentReconnectGrace = config.Duration(grace)
	var ids []string
	s := newShard(t, cfg.build(t), shardOptions{monitor: true, prepare: func(s *shard) {
		ctx := context.Background()
		_, err := s.groups.Load(ctx)
		require.NoError(t, err)
		_, _, err = s.groups.Upsert(ctx, groups.Key{Tenant: "t", ID: "web"}, groups.Spec{Template: "worker", Size: 3}, "")
		require.NoError(t, err)
		for range 3 {
			id, err := instances.NewID("web")
			require.NoError(t, err)
			pid := provider.ID("c1", "s1", id)
			_, err = s.p.Create(ctx, provider.CreateRequest{InstanceID: id, ProviderID: pid})
			require.NoError(t, err)
			require.NoError(t, s.insts.Create(ctx, &instances.Record{ID: id, Tenant: "t", GroupID: "web", Shard: "s1",
				ProviderID: pid, State: instances.StateRunning, Template: "worker", InstanceType: "test.small",
				SubnetPool: "default", CreatedAt: epoch.Add(-time.Hour)}))
			ids = append(ids, id)
		}
	}})
	steady, flaky, absent := ids[0], ids[1], ids[2]
	state := func(id string) instances.State {
		rec, ok := s.insts.Get(id)
		require.True(t, ok, id)
		return rec.State
	}
	s.run(t)
	// flaky reports once, then goes quiet; steady reports every interval;
	// absent never reconnects.
	s.agents.report(flaky, nil)
	for elapsed := time.Duration(0); elapsed < grace-100*time.Millisecond; elapsed += 100 * time.Millisecond {
		s.agents.report(steady, nil)
		s.advance(t, 100*time.Millisecond)
		for _, id := range ids {
			require.Equal(t, instances.StateRunning, state(id), "%s at %s into the term: no verdict within the reconnect grace", id, elapsed)
		}
	}
	creates, deletes := s.p.Counts()
	require.Equal(t, 3, creates, "no replacement during the grace")
	require.Zero(t, deletes)
	for range 5 {
		s.agents.report(steady, nil)
		s.advance(t, 100*time.Millisecond)
	}
	require.Equal(t, instances.StateRunning, state(steady))
	require.Equal(t, instances.StateUnhealthy, state(flaky), "judged once the grace is over")
	require.Equal(t, instances.StateUnhealthy, state(absent), "judged once the grace is over")
}

// TestLeadingAgainStartsWithEmptyMemory: what one term learned from agents
// (reports, a termination notice, the agent version) and from the provider
// (an orphan's first sighting) is gone when the same reconciler leads
// again, as it would be for a fresh leader. Before, notices, versions and
// orphans outlived the term.
func TestLeadingAgainStartsWithEmptyMemory(t *testing.T) {
	ctx := context.Background()
	orphan, err := instances.NewID("web")
	require.NoError(t, err)
	// Left before the term: the term's first pass (garbage collection) sees it.
	s := newShard(t, newShardConfig(t).build(t), shardOptions{monitor: true, prepare: func(s *shard) {
		_, err := s.p.Create(ctx, provider.CreateRequest{InstanceID: orphan, ProviderID: provider.ID("c1", "s1", orphan), Cluster: "c1", Shard: "s1"})
		require.NoError(t, err)
	}})
	s.agents.version["i-1"] = "v1"
	s.agents.report("i-1", &nstancev1.TerminationNotice{Kind: nstancev1.TerminationKind_TERMINATION_KIND_SPOT})
	s.term.Resync(t)
	reporting, notices, versions, orphans := s.r.TermMemory()
	require.Equal(t, [4]int{1, 1, 1, 1}, [4]int{reporting, notices, versions, orphans}, "the first term's memory")
	require.Equal(t, "v1", s.r.ReportedVersion("i-1"))

	s.term.End()
	s.startTerm(t)
	reporting, notices, versions, _ = s.r.TermMemory()
	require.Equal(t, [3]int{0, 0, 0}, [3]int{reporting, notices, versions}, "the second term starts without the first's agent memory")
	require.Empty(t, s.r.ReportedVersion("i-1"))
	// The orphan is seen again, as new: its first sighting is this term's.
	_, _, _, orphans = s.r.TermMemory()
	require.Equal(t, 1, orphans)
}
