package machinepool

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

func TestPlanReplicas(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	m := func(shard, id string, ageHours int, mod ...func(*Member)) Member {
		x := Member{Shard: shard, InstanceID: id, Created: t0.Add(-time.Duration(ageHours) * time.Hour)}
		for _, f := range mod {
			f(&x)
		}
		return x
	}
	marked := func(x *Member) { x.DeleteMachine = true }
	deleting := func(x *Member) { x.Deleting = true }
	sick := func(x *Member) { x.Unhealthy = true }
	ab := []string{"a", "b"}
	// Four members over a and b; a2 and b1 are the oldest of each shard.
	four := []Member{m("a", "a1", 1), m("a", "a2", 9), m("b", "b1", 8), m("b", "b2", 2)}
	with := func(ms []Member, id string, f func(*Member)) []Member {
		out := append([]Member(nil), ms...)
		for i := range out {
			if out[i].InstanceID == id {
				f(&out[i])
			}
		}
		return out
	}

	tests := []struct {
		name    string
		shards  []string
		current map[string]int32
		members []Member
		desired int32
		policy  infrav1.DeletePolicy
		sizes   map[string]int32
		victims []string
	}{
		{"from nothing: even, remainder first", ab, nil, nil, 5, "", map[string]int32{"a": 3, "b": 2}, nil},
		{"growth goes where fewest", ab, map[string]int32{"a": 1, "b": 2}, nil, 4, "", map[string]int32{"a": 2, "b": 2}, nil},
		{"growth tie goes to the earlier shard", []string{"b", "a"}, map[string]int32{"a": 2, "b": 2}, nil, 5, "", map[string]int32{"a": 2, "b": 3}, nil},
		{"steady keeps an uneven split", ab, map[string]int32{"a": 1, "b": 2}, four[1:], 3, "", map[string]int32{"a": 1, "b": 2}, nil},
		{"marked member in the first shard", ab, map[string]int32{"a": 2, "b": 2}, with(four, "a1", marked), 3, "",
			map[string]int32{"a": 1, "b": 2}, []string{"a1"}},
		{"marked member in the second shard", ab, map[string]int32{"a": 2, "b": 2}, with(four, "b2", marked), 3, "",
			map[string]int32{"a": 2, "b": 1}, []string{"b2"}},
		{"two marked in one shard", ab, map[string]int32{"a": 2, "b": 2}, with(with(four, "b1", marked), "b2", marked), 2, "",
			map[string]int32{"a": 2, "b": 0}, []string{"b1", "b2"}},
		{"marked beats policy and health", ab, map[string]int32{"a": 2, "b": 2}, with(with(four, "b2", marked), "a1", sick), 3, infrav1.DeletePolicyOldest,
			map[string]int32{"a": 2, "b": 1}, []string{"b2"}},
		{"deleting Machine first", ab, map[string]int32{"a": 2, "b": 2}, with(with(four, "b2", marked), "a1", deleting), 3, "",
			map[string]int32{"a": 1, "b": 2}, []string{"a1"}},
		{"more marked than the scale-down: by id", ab, map[string]int32{"a": 2, "b": 2}, with(with(four, "b1", marked), "a2", marked), 3, "",
			map[string]int32{"a": 1, "b": 2}, []string{"a2"}},
		{"marked, then policy", ab, map[string]int32{"a": 2, "b": 2}, with(four, "a1", marked), 2, infrav1.DeletePolicyOldest,
			map[string]int32{"a": 0, "b": 2}, []string{"a1", "a2"}},
		{"unrealised replicas before running ones", ab, map[string]int32{"a": 3, "b": 2}, four, 4, infrav1.DeletePolicyOldest,
			map[string]int32{"a": 2, "b": 2}, nil},
		{"marked before unrealised replicas", ab, map[string]int32{"a": 3, "b": 2}, with(four, "b1", marked), 4, "",
			map[string]int32{"a": 3, "b": 1}, []string{"b1"}},
		{"oldest over all shards", ab, map[string]int32{"a": 2, "b": 2}, four, 2, infrav1.DeletePolicyOldest,
			map[string]int32{"a": 1, "b": 1}, []string{"a2", "b1"}},
		{"newest over all shards", ab, map[string]int32{"a": 2, "b": 2}, four, 2, infrav1.DeletePolicyNewest,
			map[string]int32{"a": 1, "b": 1}, []string{"a1", "b2"}},
		{"oldest may empty a shard", ab, map[string]int32{"a": 2, "b": 2}, []Member{m("a", "a1", 9), m("a", "a2", 8), m("b", "b1", 1), m("b", "b2", 2)}, 2, infrav1.DeletePolicyOldest,
			map[string]int32{"a": 0, "b": 2}, []string{"a1", "a2"}},
		{"random keeps shards even, later shard on a tie", ab, map[string]int32{"a": 2, "b": 2}, four, 2, infrav1.DeletePolicyRandom,
			map[string]int32{"a": 1, "b": 1}, []string{"b1", "a1"}},
		{"random from the bigger shard", ab, map[string]int32{"a": 3, "b": 1}, append(four[:2:2], m("a", "a3", 5), m("b", "b2", 1)), 3, "",
			map[string]int32{"a": 2, "b": 1}, []string{"a1"}},
		{"unhealthy first", ab, map[string]int32{"a": 2, "b": 2}, with(four, "a1", sick), 3, infrav1.DeletePolicyOldest,
			map[string]int32{"a": 1, "b": 2}, []string{"a1"}},
		{"to zero", ab, map[string]int32{"a": 2, "b": 2}, four, 0, "",
			map[string]int32{"a": 0, "b": 0}, []string{"b1", "a1", "b2", "a2"}},
		{"members of other shards are ignored", ab, map[string]int32{"a": 1, "b": 1}, []Member{m("a", "a1", 1), m("c", "c1", 1, marked), m("b", "b1", 1)}, 1, "",
			map[string]int32{"a": 1, "b": 0}, []string{"b1"}},
		{"a marked member of an empty shard is not taken", ab, map[string]int32{"a": 2, "b": 0}, []Member{m("a", "a1", 1), m("a", "a2", 2), m("b", "b1", 1, marked)}, 1, "",
			map[string]int32{"a": 1, "b": 0}, []string{"a1"}},
		{"negative desired is zero", ab, map[string]int32{"a": 1}, []Member{m("a", "a1", 1)}, -2, "",
			map[string]int32{"a": 0, "b": 0}, []string{"a1"}},
		{"no shards", nil, map[string]int32{"a": 2}, four, 1, "", map[string]int32{}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := PlanReplicas(tt.shards, tt.current, tt.members, tt.desired, tt.policy)
			require.Equal(t, tt.sizes, p.Sizes)
			var ids []string
			for _, v := range p.Victims {
				ids = append(ids, v.InstanceID)
			}
			require.Equal(t, tt.victims, ids)
			if len(tt.shards) > 0 {
				var sum int32
				for _, s := range p.Sizes {
					sum += s
				}
				require.Equal(t, max(tt.desired, 0), sum, "the sizes add up to desired")
			}
			// A retry with the same inputs plans the same.
			require.Equal(t, p, PlanReplicas(tt.shards, tt.current, tt.members, tt.desired, tt.policy))
		})
	}
}

// TestPlanReplicasFromNothingIsSplitReplicas: a new pool is split as
// SplitReplicas says (which the importer relies on).
func TestPlanReplicasFromNothingIsSplitReplicas(t *testing.T) {
	for _, shards := range [][]string{{"a"}, {"a", "b"}, {"c", "a", "b"}} {
		for n := int32(0); n < 8; n++ {
			t.Run(fmt.Sprint(shards, n), func(t *testing.T) {
				require.Equal(t, SplitReplicas(n, shards), PlanReplicas(shards, nil, nil, n, "").Sizes)
			})
		}
	}
}

// TestPlanReplicasScaleDownOfAChosenMember: for every member of a
// 4-replica pool over two shards, marking it and asking for 3 removes
// exactly it and splits 1/2 or 2/1 accordingly, whatever the policy.
func TestPlanReplicasScaleDownOfAChosenMember(t *testing.T) {
	now := time.Now()
	for _, policy := range []infrav1.DeletePolicy{infrav1.DeletePolicyRandom, infrav1.DeletePolicyOldest, infrav1.DeletePolicyNewest} {
		for victim := range 4 {
			ms := make([]Member, 4)
			for i := range ms {
				ms[i] = Member{Shard: []string{"a", "b"}[i/2], InstanceID: fmt.Sprintf("i%d", i), Created: now.Add(time.Duration(i) * time.Minute)}
			}
			ms[victim].DeleteMachine = true
			p := PlanReplicas([]string{"a", "b"}, map[string]int32{"a": 2, "b": 2}, ms, 3, policy)
			require.Equal(t, []Member{ms[victim]}, p.Victims, "policy %s victim %d", policy, victim)
			want := map[string]int32{"a": 2, "b": 2}
			want[ms[victim].Shard] = 1
			require.Equal(t, want, p.Sizes)
		}
	}
}
