package machinepool

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

var pausedShard = infrav1.ShardRollout{Paused: true}

func budget(surge, unavailable int32) infrav1.ShardRollout {
	return infrav1.ShardRollout{MaxSurge: ptr.To(surge), MaxUnavailable: unavailable}
}

func TestPlanRollout(t *testing.T) {
	known := func(shard string, size, replicas, upToDate int32, holds bool) ShardState {
		return ShardState{Shard: shard, Size: size, Known: true, Replicas: replicas, UpToDate: upToDate, Budget: holds}
	}
	tests := []struct {
		name     string
		shards   []ShardState
		paused   bool
		want     map[string]infrav1.ShardRollout
		rolling  string
		outdated []string
		upToDate int32
	}{
		{
			name:   "nothing to roll: every shard paused, none rolling",
			shards: []ShardState{known("a", 3, 3, 3, false), known("b", 3, 3, 3, false)},
			want:   map[string]infrav1.ShardRollout{"a": pausedShard, "b": pausedShard}, upToDate: 6,
		},
		{
			name:   "both drifted: the first shard in order gets the whole budget",
			shards: []ShardState{known("a", 3, 3, 0, false), known("b", 3, 3, 0, false)},
			want:   map[string]infrav1.ShardRollout{"a": budget(1, 0), "b": pausedShard}, rolling: "a", outdated: []string{"a", "b"},
		},
		{
			name:   "the holder keeps the budget until it is up to date",
			shards: []ShardState{known("a", 3, 3, 0, false), known("b", 3, 4, 2, true)},
			want:   map[string]infrav1.ShardRollout{"a": pausedShard, "b": budget(1, 0)}, rolling: "b", outdated: []string{"a", "b"}, upToDate: 2,
		},
		{
			name:   "the holder is done: the next shard that is not gets it",
			shards: []ShardState{known("a", 3, 3, 3, true), known("b", 3, 3, 0, false)},
			want:   map[string]infrav1.ShardRollout{"a": pausedShard, "b": budget(1, 0)}, rolling: "b", outdated: []string{"b"}, upToDate: 3,
		},
		{
			name:   "a surge member in flight keeps the shard rolling",
			shards: []ShardState{known("a", 3, 4, 3, true), known("b", 3, 3, 0, false)},
			want:   map[string]infrav1.ShardRollout{"a": budget(1, 0), "b": pausedShard}, rolling: "a", outdated: []string{"a", "b"}, upToDate: 3,
		},
		{
			name: "a shard whose server has not confirmed the settings counts as not up to date",
			shards: []ShardState{{Shard: "a", Size: 3, Replicas: 3, UpToDate: 3},
				known("b", 3, 3, 3, false)},
			want: map[string]infrav1.ShardRollout{"a": budget(1, 0), "b": pausedShard}, rolling: "a", outdated: []string{"a"}, upToDate: 3,
		},
		{
			name:    "paused: every shard paused, the holder keeps its bounds, drift still reported",
			shards:  []ShardState{known("a", 3, 3, 0, false), known("b", 3, 4, 1, true)},
			paused:  true,
			want:    map[string]infrav1.ShardRollout{"a": pausedShard, "b": {MaxSurge: ptr.To[int32](1), Paused: true}},
			rolling: "b", outdated: []string{"a", "b"}, upToDate: 1,
		},
		{
			name:   "paused before any shard held the budget: none gets it",
			shards: []ShardState{known("a", 3, 3, 0, false), known("b", 3, 3, 0, false)},
			paused: true,
			want:   map[string]infrav1.ShardRollout{"a": pausedShard, "b": pausedShard}, outdated: []string{"a", "b"},
		},
		{
			name:   "a scale-up of an up-to-date shard needs no budget",
			shards: []ShardState{known("a", 5, 3, 3, false)},
			want:   map[string]infrav1.ShardRollout{"a": pausedShard}, upToDate: 3,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := PlanRollout(tc.shards, 1, 0, tc.paused)
			require.Equal(t, tc.want, p.Budgets)
			require.Equal(t, tc.rolling, p.Rolling)
			require.Equal(t, tc.outdated, p.Outdated)
			require.Equal(t, tc.upToDate, p.UpToDate)
			for shard, b := range p.Budgets {
				require.False(t, !b.Paused && ptr.Deref(b.MaxSurge, 1) == 0 && b.MaxUnavailable == 0,
					"shard %s: the server refuses both bounds 0", shard)
			}
		})
	}
}

// TestPlanRolloutPoolWideBounds plays a rollout of 3 shards forward with a
// simple model of the server's rotation (surge first, a drifted member goes
// once its replacement is ready) and checks at every step that at most one
// shard holds budget, the pool never runs more than replicas+maxSurge
// members nor fewer than replicas-maxUnavailable ready ones, and that the
// rollout ends with every member up to date.
func TestPlanRolloutPoolWideBounds(t *testing.T) {
	for _, b := range []struct{ surge, unavailable int32 }{{1, 0}, {2, 0}, {0, 1}, {2, 1}} {
		t.Run(fmt.Sprintf("surge %d unavailable %d", b.surge, b.unavailable), func(t *testing.T) {
			type shard struct {
				name                       string
				size, drifted, fresh, born int32 // born: created, ready next step
				rollout                    infrav1.ShardRollout
			}
			shards := []*shard{{name: "a", size: 3, drifted: 3}, {name: "b", size: 2, drifted: 2}, {name: "c", size: 1, drifted: 1}}
			const replicas = 6
			for step := 0; step < 100; step++ {
				var states []ShardState
				for _, s := range shards {
					states = append(states, ShardState{Shard: s.name, Size: s.size, Known: true,
						Replicas: s.drifted + s.fresh + s.born, UpToDate: s.fresh + s.born, Budget: s.rollout.MaxSurge != nil})
				}
				paused := step%7 >= 4 // paused for three steps of every seven
				p := PlanRollout(states, b.surge, b.unavailable, paused)
				if !p.RollingOut() {
					require.EqualValues(t, replicas, p.UpToDate)
					return
				}
				holders := 0
				for _, s := range shards {
					s.rollout = p.Budgets[s.name]
					if s.rollout.MaxSurge != nil {
						holders++
					}
				}
				require.LessOrEqual(t, holders, 1, "step %d", step)
				// One server step per shard, as its planner does: members
				// created last step are ready now; beyond the size (and the
				// surge a rotation may use) drifted members go; a drifted
				// member is rotated out while the ready ones still cover
				// the size less the unavailability; fresh members are
				// created up to the size within the surge.
				total, ready := int32(0), int32(0)
				for _, s := range shards {
					s.fresh += s.born
					s.born = 0
					surge := ptr.Deref(s.rollout.MaxSurge, 0)
					kept := min(surge, s.drifted)
					if s.rollout.Paused {
						// Members born last step are ready now: a paused
						// shard keeps no surge member once it is ready.
						surge, kept = 0, 0
					}
					if excess := s.fresh + s.drifted - s.size - kept; excess > 0 {
						s.drifted -= min(excess, s.drifted)
					}
					for !s.rollout.Paused && s.drifted > 0 && s.fresh+s.drifted-1 >= s.size-s.rollout.MaxUnavailable {
						s.drifted--
					}
					s.born = max(0, min(s.size-s.fresh, s.size+min(surge, s.drifted)-s.fresh-s.drifted))
				}
				for _, s := range shards {
					total += s.drifted + s.fresh + s.born
					ready += s.drifted + s.fresh
				}
				require.LessOrEqual(t, total, replicas+b.surge, "step %d: members", step)
				require.GreaterOrEqual(t, ready, replicas-b.unavailable, "step %d: ready members", step)
			}
			t.Fatal("the rollout did not finish in 100 steps")
		})
	}
}

func TestRolloutBounds(t *testing.T) {
	strategy := func(surge, unavailable *intstr.IntOrString) *infrav1.MachinePoolStrategy {
		return &infrav1.MachinePoolStrategy{RollingUpdate: &infrav1.MachineRollingUpdate{MaxSurge: surge, MaxUnavailable: unavailable}}
	}
	i, s := func(v int32) *intstr.IntOrString { return ptr.To(intstr.FromInt32(v)) }, func(v string) *intstr.IntOrString { return ptr.To(intstr.FromString(v)) }
	tests := []struct {
		name               string
		strategy           *infrav1.MachinePoolStrategy
		replicas           int32
		surge, unavailable int32
		paused             bool
		err                string
	}{
		{name: "defaults", replicas: 6, surge: 1},
		{name: "numbers", strategy: strategy(i(2), i(1)), replicas: 6, surge: 2, unavailable: 1},
		{name: "percentages: surge rounds up, unavailable down", strategy: strategy(s("25%"), s("25%")), replicas: 6, surge: 2, unavailable: 1},
		{name: "both resolve to 0: one may be unavailable", strategy: strategy(s("0%"), s("10%")), replicas: 6, unavailable: 1},
		{name: "only unavailable", strategy: strategy(i(0), i(2)), replicas: 6, unavailable: 2},
		{name: "paused", strategy: &infrav1.MachinePoolStrategy{Paused: true}, replicas: 3, surge: 1, paused: true},
		{name: "bad percentage", strategy: strategy(s("x%"), nil), replicas: 3, err: "maxSurge"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			surge, unavailable, paused, err := RolloutBounds(tc.strategy, tc.replicas)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, [3]any{tc.surge, tc.unavailable, tc.paused}, [3]any{surge, unavailable, paused})
		})
	}
}

func TestRolloutStatusAndEvents(t *testing.T) {
	done := RolloutPlan{UpToDate: 6}
	rollingB := RolloutPlan{Rolling: "b", Outdated: []string{"b"}, UpToDate: 3}
	rollingA := RolloutPlan{Rolling: "a", Outdated: []string{"a", "b"}, UpToDate: 0}
	held := RolloutPlan{Rolling: "a", Outdated: []string{"a", "b"}, UpToDate: 1}

	st, reason, msg := RolloutStatus(rollingA, 6, false)
	require.Equal(t, [3]any{true, infrav1.RollingOutReason, "0/6 up to date, shard a rolling, then b"}, [3]any{st, reason, msg})
	st, reason, msg = RolloutStatus(rollingB, 6, false)
	require.Equal(t, [3]any{true, infrav1.RollingOutReason, "3/6 up to date, shard b rolling"}, [3]any{st, reason, msg})
	st, reason, msg = RolloutStatus(held, 6, true)
	require.Equal(t, [3]any{true, infrav1.RolloutPausedReason, "1/6 up to date, paused by spec.strategy.paused (shards a, b not up to date)"}, [3]any{st, reason, msg})
	st, reason, msg = RolloutStatus(done, 6, false)
	require.Equal(t, [3]any{false, infrav1.NotRollingOutReason, "6/6 up to date"}, [3]any{st, reason, msg})

	reasons := func(evs []RolloutEvent) []string {
		var out []string
		for _, e := range evs {
			out = append(out, e.Reason)
		}
		return out
	}
	tests := []struct {
		name                    string
		prevReason, prevRolling string
		plan                    RolloutPlan
		reason                  string
		want                    []string
	}{
		{"start", infrav1.NotRollingOutReason, "", rollingA, infrav1.RollingOutReason, []string{EventRolloutStarted, EventRolloutShardStep}},
		{"start on a new pool", "", "", rollingA, infrav1.RollingOutReason, []string{EventRolloutStarted, EventRolloutShardStep}},
		{"same shard: nothing", infrav1.RollingOutReason, "a", rollingA, infrav1.RollingOutReason, nil},
		{"next shard", infrav1.RollingOutReason, "a", rollingB, infrav1.RollingOutReason, []string{EventRolloutShardStep}},
		{"done", infrav1.RollingOutReason, "b", done, infrav1.NotRollingOutReason, []string{EventRolloutDone}},
		{"nothing to do", infrav1.NotRollingOutReason, "", done, infrav1.NotRollingOutReason, nil},
		{"paused", infrav1.RollingOutReason, "a", held, infrav1.RolloutPausedReason, []string{EventRolloutPaused}},
		{"still paused", infrav1.RolloutPausedReason, "a", held, infrav1.RolloutPausedReason, nil},
		{"resumed where it stopped", infrav1.RolloutPausedReason, "a", rollingA, infrav1.RollingOutReason, []string{EventRolloutResumed}},
		{"paused before it started, resumed", infrav1.RolloutPausedReason, "", rollingA, infrav1.RollingOutReason, []string{EventRolloutResumed, EventRolloutShardStep}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, reasons(RolloutEvents(tc.prevReason, tc.prevRolling, tc.plan, tc.reason, "m")))
		})
	}
}
