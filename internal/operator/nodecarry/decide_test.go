package nodecarry

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var (
	t0     = time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	policy = Policy{LabelPrefixes: []string{"example.com/", "kubernetes.io/"}, TaintPrefixes: []string{"dedicated", "node.kubernetes.io/"},
		Settle: 10 * time.Second, Window: 15 * time.Minute, TTL: time.Hour, Max: 3}
	gpu = corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}
)

func metavTime() *metav1.Time { t := metav1.NewTime(t0); return &t }

func at(d time.Duration) time.Time { return t0.Add(d) }

func node(name string, labels map[string]string, taints ...corev1.Taint) *Node {
	return &Node{Name: name, Labels: labels, Taints: taints}
}

func carried(n *Node, from string) *Node { n.CarriedFrom = from; return n }

// labelled is a user-labelled, tainted Node: the carried keys and keys no
// prefix selects or that Kubernetes owns.
func labelled(name string) *Node {
	return node(name, map[string]string{"example.com/team": "x", "other.io/keep": "no", "kubernetes.io/hostname": name},
		gpu, corev1.Taint{Key: "node.kubernetes.io/unschedulable", Effect: corev1.TaintEffectNoSchedule},
		corev1.Taint{Key: "ToBeDeletedByClusterAutoscaler", Effect: corev1.TaintEffectNoSchedule})
}

func entry(shard, id string, created, departed time.Time, to string) Entry {
	return Entry{Shard: shard, Instance: id, Node: id, Created: created, Departed: departed,
		Labels: map[string]string{"example.com/team": "x"}, Taints: []corev1.Taint{gpu}, To: to}
}

func TestCarried(t *testing.T) {
	labels, taints := Carried(policy, labelled("n"))
	require.Equal(t, map[string]string{"example.com/team": "x"}, labels, "kubernetes.io/ is reserved even when a prefix names it")
	require.Equal(t, []corev1.Taint{gpu}, taints)
	labels, taints = Carried(Policy{}, labelled("n"))
	require.Empty(t, labels, "no prefixes: nothing")
	require.Empty(t, taints)
	now := metavTime()
	_, taints = Carried(policy, node("n", nil, corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule, TimeAdded: now}))
	require.Nil(t, taints[0].TimeAdded)
}

func TestDecide(t *testing.T) {
	type want struct {
		entries []Entry
		apply   []Apply
		drops   []string // "{key} {reason}"
	}
	tests := []struct {
		name string
		in   Input
		want want
	}{
		{
			name: "a replaced member's Node is recorded; nothing to give yet",
			in: Input{Now: at(0), Members: []Member{
				{Shard: "a", ID: "old", Created: at(-time.Hour), Departing: true, Replaced: true, Node: labelled("old")},
				{Shard: "a", ID: "peer", Created: at(-30 * time.Minute), Node: node("peer", nil)},
			}},
			want: want{entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "")}},
		},
		{
			name: "a scaled-down member is not recorded",
			in: Input{Now: at(0), Members: []Member{
				{Shard: "a", ID: "old", Created: at(-time.Hour), Departing: true, Node: labelled("old")},
				{Shard: "a", ID: "new", Created: at(time.Second), Node: node("new", nil)},
			}},
		},
		{
			name: "a replaced member without carried keys or without a Node is not recorded",
			in: Input{Now: at(0), Members: []Member{
				{Shard: "a", ID: "plain", Created: at(-time.Hour), Departing: true, Replaced: true, Node: node("plain", map[string]string{"other.io/x": "y"})},
				{Shard: "a", ID: "nonode", Created: at(-time.Hour), Departing: true, Replaced: true},
			}},
		},
		{
			name: "before Settle no successor is chosen, even one that has its Node",
			in: Input{Now: at(5 * time.Second), State: State{Entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "")}}, Members: []Member{
				{Shard: "a", ID: "old", Created: at(-time.Hour), Departing: true, Replaced: true, Node: labelled("old")},
				{Shard: "a", ID: "new", Created: at(time.Second), Node: node("new", nil)},
			}},
			want: want{entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "")}},
		},
		{
			name: "after Settle the newest member takes it and its Node receives what it lacks",
			in: Input{Now: at(10 * time.Second), State: State{Entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "")}}, Members: []Member{
				{Shard: "a", ID: "old", Created: at(-time.Hour), Departing: true, Replaced: true, Node: labelled("old")},
				{Shard: "a", ID: "unrelated", Created: at(-20 * time.Minute), Node: node("unrelated", nil)},
				{Shard: "a", ID: "surge", Created: at(-5 * time.Minute), Node: node("surge", nil)},
				{Shard: "a", ID: "new", Created: at(time.Second), Node: node("new", map[string]string{"other.io/x": "y"})},
			}},
			want: want{apply: []Apply{{Node: "new", Entry: entry("a", "old", at(-time.Hour), at(0), "a/new"),
				Labels: map[string]string{"example.com/team": "x"}, Taints: []corev1.Taint{gpu}}}},
		},
		{
			name: "a rotation's surge member, created before the departure, takes it",
			in: Input{Now: at(time.Minute), State: State{Entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "")}}, Members: []Member{
				{Shard: "a", ID: "unrelated", Created: at(-20 * time.Minute), Node: node("unrelated", nil)},
				{Shard: "a", ID: "surge", Created: at(-5 * time.Minute), Node: node("surge", nil)},
			}},
			want: want{apply: []Apply{{Node: "surge", Entry: entry("a", "old", at(-time.Hour), at(0), "a/surge"),
				Labels: map[string]string{"example.com/team": "x"}, Taints: []corev1.Taint{gpu}}}},
		},
		{
			name: "a member older than the window, or than the departed one, never takes it",
			in: Input{Now: at(time.Minute), State: State{Entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "")}}, Members: []Member{
				{Shard: "a", ID: "unrelated", Created: at(-20 * time.Minute), Node: node("unrelated", nil)},
				{Shard: "a", ID: "older", Created: at(-2 * time.Hour), Node: node("older", nil)},
			}},
			want: want{entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "")}},
		},
		{
			name: "a successor without its Node yet is chosen and waits",
			in: Input{Now: at(time.Minute), State: State{Entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "")}}, Members: []Member{
				{Shard: "a", ID: "new", Created: at(time.Second)},
			}},
			want: want{entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "a/new")}},
		},
		{
			name: "the departed one's shard comes first, then the other shards",
			in: Input{Now: at(time.Minute), State: State{Entries: []Entry{entry("a", "old", at(-time.Hour), at(0), ""), entry("b", "old2", at(-time.Hour), at(time.Second), "")}}, Members: []Member{
				{Shard: "b", ID: "newer-b", Created: at(3 * time.Second)},
				{Shard: "a", ID: "new-a", Created: at(2 * time.Second)},
				{Shard: "a", ID: "newest-a", Created: at(4 * time.Second)},
			}},
			want: want{entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "a/newest-a"), entry("b", "old2", at(-time.Hour), at(time.Second), "b/newer-b")}},
		},
		{
			name: "two departures, one successor: the earlier departure takes it, the other waits",
			in: Input{Now: at(time.Minute), State: State{Entries: []Entry{entry("a", "x2", at(-time.Hour), at(time.Second), ""), entry("a", "x1", at(-time.Hour), at(0), "")}}, Members: []Member{
				{Shard: "a", ID: "new", Created: at(2 * time.Second)},
			}},
			want: want{entries: []Entry{entry("a", "x1", at(-time.Hour), at(0), "a/new"), entry("a", "x2", at(-time.Hour), at(time.Second), "")}},
		},
		{
			name: "a Node that received an entry is not a successor again",
			in: Input{Now: at(time.Minute), State: State{Entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "")}}, Members: []Member{
				{Shard: "a", ID: "new", Created: at(time.Second), Node: carried(node("new", nil), "a/other")},
			}},
			want: want{entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "")}},
		},
		{
			name: "the Node's own labels and taints win",
			in: Input{Now: at(time.Minute), State: State{Entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "a/new")}}, Members: []Member{
				{Shard: "a", ID: "new", Created: at(time.Second), Node: node("new", map[string]string{"example.com/team": "y"},
					corev1.Taint{Key: "dedicated", Value: "cpu", Effect: corev1.TaintEffectNoSchedule})},
			}},
			want: want{apply: []Apply{{Node: "new", Entry: entry("a", "old", at(-time.Hour), at(0), "a/new"), Conflicts: []string{"example.com/team"}}}},
		},
		{
			name: "a taint with the same key but another effect is added",
			in: Input{Now: at(time.Minute), State: State{Entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "a/new")}}, Members: []Member{
				{Shard: "a", ID: "new", Created: at(time.Second), Node: node("new", map[string]string{"example.com/team": "x"},
					corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoExecute})},
			}},
			want: want{apply: []Apply{{Node: "new", Entry: entry("a", "old", at(-time.Hour), at(0), "a/new"), Taints: []corev1.Taint{gpu}}}},
		},
		{
			name: "already applied (the state was not stored): dropped",
			in: Input{Now: at(time.Minute), State: State{Entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "a/new")}}, Members: []Member{
				{Shard: "a", ID: "new", Created: at(time.Second), Node: carried(node("new", nil), "a/old")},
			}},
			want: want{drops: []string{"a/old " + DropDone}},
		},
		{
			name: "a successor scaled down before its Node came: dropped",
			in: Input{Now: at(time.Minute), State: State{Entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "a/new")}}, Members: []Member{
				{Shard: "a", ID: "new", Created: at(time.Second), Departing: true},
				{Shard: "a", ID: "other", Created: at(2 * time.Second)},
			}},
			want: want{drops: []string{"a/old " + DropSuccessorGone}},
		},
		{
			name: "a successor gone from its shard's list: dropped",
			in:   Input{Now: at(time.Minute), State: State{Entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "a/new")}}},
			want: want{drops: []string{"a/old " + DropSuccessorGone}},
		},
		{
			name: "a successor replaced itself hands the entry on",
			in: Input{Now: at(time.Minute), State: State{Entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "a/new")}}, Members: []Member{
				{Shard: "a", ID: "new", Created: at(time.Second), Departing: true, Replaced: true},
				{Shard: "a", ID: "newer", Created: at(30 * time.Second)},
			}},
			want: want{entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "a/newer")}},
		},
		{
			name: "a shard that did not answer: its entries wait, pinned or not",
			in: Input{Now: at(time.Minute), Unanswered: map[string]bool{"a": true}, State: State{Entries: []Entry{
				entry("a", "old", at(-time.Hour), at(0), "a/new"), entry("a", "old2", at(-time.Hour), at(time.Second), "")}}, Members: []Member{
				{Shard: "b", ID: "new-b", Created: at(2 * time.Second)},
			}},
			want: want{entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "a/new"), entry("a", "old2", at(-time.Hour), at(time.Second), "")}},
		},
		{
			name: "entries expire after TTL",
			in:   Input{Now: at(time.Hour + time.Second), State: State{Entries: []Entry{entry("a", "old", at(-time.Hour), at(0), ""), entry("a", "young", at(-time.Hour), at(30*time.Minute), "")}}},
			want: want{entries: []Entry{entry("a", "young", at(-time.Hour), at(30*time.Minute), "")}, drops: []string{"a/old " + DropExpired}},
		},
		{
			name: "beyond Max the oldest departures go",
			in: Input{Now: at(5 * time.Second), Members: []Member{
				{Shard: "a", ID: "d1", Created: at(-time.Hour), Departing: true, Replaced: true, Node: labelled("d1")},
				{Shard: "a", ID: "d2", Created: at(-time.Hour), Departing: true, Replaced: true, Node: labelled("d2")},
			}, State: State{Entries: []Entry{entry("a", "e1", at(-time.Hour), at(0), ""), entry("a", "e2", at(-time.Hour), at(time.Second), "")}}},
			want: want{entries: []Entry{entry("a", "e2", at(-time.Hour), at(time.Second), ""), entry("a", "d1", at(-time.Hour), at(5*time.Second), ""), entry("a", "d2", at(-time.Hour), at(5*time.Second), "")},
				drops: []string{"a/e1 " + DropBound}},
		},
		{
			name: "a departure already carried is not recorded again while it drains",
			in: Input{Now: at(time.Minute), Members: []Member{
				{Shard: "a", ID: "old", Created: at(-time.Hour), Departing: true, Replaced: true, Node: labelled("old")},
				{Shard: "a", ID: "new", Created: at(time.Second), Node: carried(node("new", map[string]string{"example.com/team": "x"}), "a/old")},
			}},
		},
		{
			name: "a departure seen on the stream is recorded though its instance is no longer listed",
			in: Input{Now: at(time.Second), Departed: []Entry{entry("a", "gone", at(-time.Hour), at(0), "")}, Members: []Member{
				{Shard: "a", ID: "peer", Created: at(-30 * time.Minute), Node: node("peer", nil)},
			}},
			want: want{entries: []Entry{entry("a", "gone", at(-time.Hour), at(0), "")}},
		},
		{
			name: "a departure seen on the stream and in the list is recorded once, as first seen",
			in: Input{Now: at(5 * time.Second), Departed: []Entry{entry("a", "old", at(-time.Hour), at(0), "")}, Members: []Member{
				{Shard: "a", ID: "old", Created: at(-time.Hour), Departing: true, Replaced: true, Node: labelled("old")},
			}},
			want: want{entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "")}},
		},
		{
			name: "a departure seen on the stream that a successor already carries is not recorded",
			in: Input{Now: at(time.Minute), Departed: []Entry{entry("a", "old", at(-time.Hour), at(0), "")}, Members: []Member{
				{Shard: "a", ID: "new", Created: at(time.Second), Node: carried(node("new", nil), "a/old")},
			}},
		},
		{
			name: "a recorded departure is not recorded twice",
			in: Input{Now: at(5 * time.Second), State: State{Entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "")}}, Members: []Member{
				{Shard: "a", ID: "old", Created: at(-time.Hour), Departing: true, Replaced: true, Node: labelled("old")},
			}},
			want: want{entries: []Entry{entry("a", "old", at(-time.Hour), at(0), "")}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := tt.in
			in.Policy = policy
			d := Decide(in)
			require.Equal(t, tt.want.entries, d.State.Entries, "entries")
			require.Equal(t, tt.want.apply, d.Apply, "apply")
			var drops []string
			for _, dr := range d.Drop {
				drops = append(drops, dr.Entry.Key()+" "+dr.Reason)
			}
			require.Equal(t, tt.want.drops, drops, "drops")
		})
	}
}
