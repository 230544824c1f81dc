package rollguard

import "testing"

func TestPlan(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rolling bool
		node    Node
		want    Action
	}{
		{"rolling, bare Node: disable", true, Node{}, Disable},
		{"rolling, already ours: keep", true, Node{HasDisabled: true, Disabled: "true", Owned: true}, Keep},
		{"rolling, the user's own true: keep, never ours", true, Node{HasDisabled: true, Disabled: "true"}, Keep},
		{"rolling, the user's own false: keep (theirs to decide)", true, Node{HasDisabled: true, Disabled: "false"}, Keep},
		{"rolling, ours but the user removed the annotation: keep (no fight)", true, Node{Owned: true}, Keep},
		{"done, ours: release", false, Node{HasDisabled: true, Disabled: "true", Owned: true}, Release},
		{"done, ours without the annotation: release the record", false, Node{Owned: true}, Release},
		{"done, the user's: keep", false, Node{HasDisabled: true, Disabled: "true"}, Keep},
		{"done, bare: keep", false, Node{}, Keep},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Plan(tc.rolling, tc.node); got != tc.want {
				t.Fatalf("Plan(%v, %+v) = %v, want %v", tc.rolling, tc.node, got, tc.want)
			}
		})
	}
}

func TestPlanPool(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		rolling, held, disables bool
		want                    PoolStep
	}{
		{"rolling, a Node to guard, no record: record first", true, false, true, PoolStep{Hold: true}},
		{"rolling, a Node to guard, recorded: nothing more", true, true, true, PoolStep{}},
		{"rolling, nothing to guard: no record yet", true, false, false, PoolStep{}},
		{"done, recorded: read past the cache, then drop the record", false, true, false, PoolStep{ReadLive: true, Unhold: true}},
		{"done, no record: the cache suffices", false, false, false, PoolStep{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PlanPool(tc.rolling, tc.held, tc.disables); got != tc.want {
				t.Fatalf("PlanPool(%v, %v, %v) = %+v, want %+v", tc.rolling, tc.held, tc.disables, got, tc.want)
			}
		})
	}
}
