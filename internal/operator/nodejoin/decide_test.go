package nodejoin

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/types"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func TestDecide(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	const timeout = 10 * time.Minute
	running := nstancev1.InstanceState_INSTANCE_STATE_RUNNING
	inst := func(id string, firstHealthAgo time.Duration, mutate ...func(*Instance)) Instance {
		i := Instance{Shard: "s1", ID: id, Group: "web", ProviderID: "nstance://c1/s1/" + id, State: running}
		if firstHealthAgo > 0 {
			i.FirstHealthAt = now.Add(-firstHealthAgo)
		}
		for _, m := range mutate {
			m(&i)
		}
		return i
	}
	node := func(id string, ready bool, changedAgo time.Duration) Node {
		n := Node{Name: "node-" + id, UID: types.UID("uid-" + id), ProviderID: "nstance://c1/s1/" + id, Ready: ready}
		if changedAgo > 0 {
			n.ReadyChanged = now.Add(-changedAgo)
		}
		return n
	}
	state := func(s nstancev1.InstanceState) func(*Instance) { return func(i *Instance) { i.State = s } }
	joined := func(i *Instance) { i.Joined = true }

	tests := []struct {
		name       string
		instances  []Instance
		nodes      []Node
		unanswered map[string]bool
		reported   map[types.UID]bool
		timeout    time.Duration // 0: timeout
		late       []string      // "id" or "id@node"
		joined     []string
		orphans    []string // "node" or "node(new)"
		next       time.Duration
	}{
		{name: "never reported is not late", instances: []Instance{inst("a", 0)}},
		{name: "reported, no Node, before the deadline", instances: []Instance{inst("a", 9*time.Minute)}, next: time.Minute},
		{name: "reported, no Node, past the deadline", instances: []Instance{inst("a", 11*time.Minute)}, late: []string{"a"}},
		{name: "exactly at the deadline is late", instances: []Instance{inst("a", timeout)}, late: []string{"a"}},
		{name: "Ready Node in time joins", instances: []Instance{inst("a", 2*time.Minute)}, nodes: []Node{node("a", true, time.Minute)}, joined: []string{"a"}},
		{name: "Ready Node past the deadline joins (late, but here now)", instances: []Instance{inst("a", time.Hour)},
			nodes: []Node{node("a", true, time.Minute)}, joined: []string{"a"}},
		{name: "Ready Node of a known joined instance is not returned again", instances: []Instance{inst("a", time.Hour, joined)},
			nodes: []Node{node("a", true, time.Minute)}},
		{name: "NotReady Node past the deadline, unchanged since before it", instances: []Instance{inst("a", 11*time.Minute)},
			nodes: []Node{node("a", false, 10*time.Minute+30*time.Second)}, late: []string{"a@node-a"}},
		{name: "NotReady Node without a Ready condition past the deadline", instances: []Instance{inst("a", 11*time.Minute)},
			nodes: []Node{node("a", false, 0)}, late: []string{"a@node-a"}},
		{name: "NotReady Node before the deadline waits", instances: []Instance{inst("a", 5*time.Minute)},
			nodes: []Node{node("a", false, 4*time.Minute)}, next: 5 * time.Minute},
		{name: "Ready once then NotReady is health, not join", instances: []Instance{inst("a", time.Hour, joined)},
			nodes: []Node{node("a", false, time.Minute)}},
		{name: "Ready once then no Node is not a join failure either", instances: []Instance{inst("a", time.Hour, joined)}},
		{name: "NotReady since after the deadline, history unknown: left alone", instances: []Instance{inst("a", time.Hour)},
			nodes: []Node{node("a", false, time.Minute)}},
		{name: "pending deletion is ignored", instances: []Instance{inst("a", time.Hour, state(nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION))}},
		{name: "deleting is ignored", instances: []Instance{inst("a", time.Hour, state(nstancev1.InstanceState_INSTANCE_STATE_DELETING))}},
		{name: "deleted is ignored", instances: []Instance{inst("a", time.Hour, state(nstancev1.InstanceState_INSTANCE_STATE_DELETED))}},
		{name: "stopped is ignored", instances: []Instance{inst("a", time.Hour, state(nstancev1.InstanceState_INSTANCE_STATE_STOPPED))}},
		{name: "unhealthy is still subject to the deadline", instances: []Instance{inst("a", time.Hour, state(nstancev1.InstanceState_INSTANCE_STATE_UNHEALTHY))},
			late: []string{"a"}},
		{name: "on-demand instance too", instances: []Instance{inst("a", time.Hour, func(i *Instance) { i.OnDemand, i.Group = true, "" })}, late: []string{"a"}},
		{name: "no provider ID yet is ignored", instances: []Instance{inst("a", time.Hour, func(i *Instance) { i.ProviderID = "" })}},
		{name: "disabled", timeout: -1, instances: []Instance{inst("a", time.Hour)}},
		{name: "disabled everywhere wins over a pool's timeout", timeout: -1,
			instances: []Instance{inst("a", time.Hour, func(i *Instance) { i.Timeout = time.Minute })}},
		{name: "pool turns it off", instances: []Instance{inst("a", time.Hour, func(i *Instance) { i.Timeout = -1 })}},
		{name: "pool's shorter timeout", instances: []Instance{inst("a", 2*time.Minute, func(i *Instance) { i.Timeout = time.Minute })}, late: []string{"a"}},
		{name: "pool's longer timeout", instances: []Instance{inst("a", 20*time.Minute, func(i *Instance) { i.Timeout = time.Hour })}, next: 40 * time.Minute},
		{name: "a Ready duplicate wins over a NotReady one", instances: []Instance{inst("a", time.Hour)},
			nodes: []Node{node("a", false, 0), {Name: "node-a2", UID: "u2", ProviderID: "nstance://c1/s1/a", Ready: true}}, joined: []string{"a"}},
		{name: "orphan Node is reported", nodes: []Node{node("x", true, time.Minute)}, orphans: []string{"node-x(new)"}},
		{name: "orphan Node reported before is not new", nodes: []Node{node("x", true, time.Minute)},
			reported: map[types.UID]bool{"uid-x": true}, orphans: []string{"node-x"}},
		{name: "Node of a deleted instance the shard still lists is not an orphan",
			instances: []Instance{inst("x", time.Hour, state(nstancev1.InstanceState_INSTANCE_STATE_DELETED))}, nodes: []Node{node("x", false, time.Minute)}},
		{name: "Node naming an unanswered shard is not an orphan", nodes: []Node{node("x", true, time.Minute)}, unanswered: map[string]bool{"s1": true}},
		{name: "Node of another cluster is not ours", nodes: []Node{{Name: "o", UID: "o", ProviderID: "nstance://c2/s1/x", Ready: true}}},
		{name: "AWS Node is not claimed", nodes: []Node{{Name: "o", UID: "o", ProviderID: "aws:///us-east-1a/i-0abc", Ready: true}}},
		{name: "Node without provider ID is not ours", nodes: []Node{{Name: "o", UID: "o"}}},
		{name: "mixed", instances: []Instance{inst("a", time.Hour), inst("b", time.Minute), inst("c", 20*time.Minute)},
			nodes: []Node{node("c", true, time.Minute), node("z", false, 0)},
			late:  []string{"a"}, joined: []string{"c"}, orphans: []string{"node-z(new)"}, next: 9 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			to := tt.timeout
			if to == 0 {
				to = timeout
			}
			d := Decide(Input{Now: now, Timeout: to, ClusterID: "c1", Instances: tt.instances, Nodes: tt.nodes,
				Unanswered: tt.unanswered, Reported: tt.reported})
			var late, joinedIDs, orphans []string
			for _, l := range d.Late {
				s := l.Instance.ID
				if l.Node != "" {
					s += "@" + l.Node
				}
				late = append(late, s)
				require.Contains(t, l.Message, l.Instance.ProviderID)
				eff := to
				if l.Instance.Timeout != 0 {
					eff = l.Instance.Timeout
				}
				require.Equal(t, l.Instance.FirstHealthAt.Add(eff), l.Deadline)
			}
			for _, j := range d.Joined {
				joinedIDs = append(joinedIDs, j.ID)
			}
			for _, o := range d.Orphans {
				s := o.Node.Name
				if o.New {
					s += "(new)"
				}
				orphans = append(orphans, s)
			}
			require.Equal(t, tt.late, late, "late")
			require.Equal(t, tt.joined, joinedIDs, "joined")
			require.Equal(t, tt.orphans, orphans, "orphans")
			if tt.next == 0 {
				require.True(t, d.Next.IsZero(), "next %s", d.Next)
			} else {
				require.Equal(t, now.Add(tt.next), d.Next)
			}
		})
	}
}

func TestLateMessage(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	d := Decide(Input{Now: now, Timeout: time.Minute, ClusterID: "c1", Instances: []Instance{{
		Shard: "s1", ID: "a", ProviderID: "nstance://c1/s1/a", State: nstancev1.InstanceState_INSTANCE_STATE_RUNNING,
		FirstHealthAt: now.Add(-90 * time.Second),
	}}})
	require.Len(t, d.Late, 1)
	require.Equal(t, "no Node with providerID nstance://c1/s1/a became Ready within the join timeout 1m0s: none registered 1m30s after the agent's first health report", d.Late[0].Message)
}
