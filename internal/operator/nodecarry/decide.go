package nodecarry

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/nstance-dev/nstance/internal/operator/config"
)

// StateAnnotation on an NstanceMachinePool holds its State as JSON: the
// labels and taints of replaced members' Nodes waiting for their successors.
// The operator owns it; it goes with the pool.
const StateAnnotation = "nstance.dev/carry"

// CarriedFromAnnotation on a Node names the departed instance
// ("{shard}/{instance}") whose labels and taints it received. A Node carrying
// it is never chosen as a successor again.
const CarriedFromAnnotation = "nstance.dev/carried-from"

// Defaults of Policy.
const (
	DefaultSettle = 10 * time.Second
	DefaultWindow = 15 * time.Minute
	DefaultTTL    = time.Hour
	DefaultMax    = 100
)

// Policy says what is carried and how long an entry waits.
type Policy struct {
	// LabelPrefixes and TaintPrefixes select the carried keys; a key
	// config.ReservedNodeKey names is never carried.
	LabelPrefixes, TaintPrefixes []string
	// Settle is how long after a departure is seen before its successor is
	// chosen, so that the member the server creates in its place (after an
	// unhealthy or deleted one) is listed by then.
	Settle time.Duration
	// Window: a successor was created after the departed instance and at
	// most Window before the departure was seen (a rotation creates the
	// surge member first, then drains the old one).
	Window time.Duration
	// TTL drops an entry no successor took that long after the departure.
	TTL time.Duration
	// Max bounds the entries of one pool; the oldest go first.
	Max int
}

// Node is what the decision reads of a Node.
type Node struct {
	Name        string
	Labels      map[string]string
	Taints      []corev1.Taint
	CarriedFrom string
}

// Member is one instance of the pool's group as its shard lists it.
type Member struct {
	Shard, ID string
	Created   time.Time
	// Departing: pending deletion, deleting or deleted.
	Departing bool
	// Replaced: the server makes up for it (InstanceStatus.replaced); a
	// scaled-down member is departing but not replaced.
	Replaced bool
	// Node is the member's Node (by provider ID), nil when none.
	Node *Node
}

// Key is "{shard}/{id}".
func (m Member) Key() string { return m.Shard + "/" + m.ID }

// Entry is one replaced member's carried labels and taints.
type Entry struct {
	Shard    string            `json:"shard"`
	Instance string            `json:"instance"`
	Node     string            `json:"node"`
	Created  time.Time         `json:"created"`
	Departed time.Time         `json:"departed"`
	Labels   map[string]string `json:"labels,omitempty"`
	Taints   []corev1.Taint    `json:"taints,omitempty"`
	// To is the chosen successor "{shard}/{instance}"; empty until chosen.
	To string `json:"to,omitempty"`
}

// Key is "{shard}/{instance}" of the departed member.
func (e Entry) Key() string { return e.Shard + "/" + e.Instance }

// State is what a pool remembers between passes.
type State struct {
	Entries []Entry `json:"entries,omitempty"`
}

// Input of Decide.
type Input struct {
	Now     time.Time
	Policy  Policy
	State   State
	Members []Member
	// Unanswered shards did not list their instances this pass: entries
	// naming them, as source or successor, wait.
	Unanswered map[string]bool
	// Departed are replaced members seen going on the instance stream since
	// the last pass (they may be gone from the list already): recorded like
	// a departing member, once.
	Departed []Entry
}

// Apply gives one successor Node what an entry carries.
type Apply struct {
	Node  string
	Entry Entry
	// Labels and Taints are the ones the Node lacks; a key the Node already
	// has keeps the Node's value (a taint: same key and effect).
	Labels map[string]string
	Taints []corev1.Taint
	// Conflicts are label keys the Node has with another value.
	Conflicts []string
}

// Drop is an entry given up, with why.
type Drop struct {
	Entry  Entry
	Reason string
}

// Drop reasons.
const (
	DropExpired       = "expired"
	DropSuccessorGone = "successor scaled down or gone"
	DropBound         = "more entries than the bound"
	DropDone          = "successor already carries it"
)

// Decision of one pass over one pool.
type Decision struct {
	// State to store (entries sorted by departure, then key).
	State State
	Apply []Apply
	Drop  []Drop
}

// Carried returns the labels and taints of n the policy carries: key with
// one of the prefixes, not reserved. Taints lose their TimeAdded.
func Carried(p Policy, n *Node) (map[string]string, []corev1.Taint) {
	if n == nil {
		return nil, nil
	}
	var labels map[string]string
	for k, v := range n.Labels {
		if selected(p.LabelPrefixes, k) {
			if labels == nil {
				labels = map[string]string{}
			}
			labels[k] = v
		}
	}
	var taints []corev1.Taint
	for _, t := range n.Taints {
		if selected(p.TaintPrefixes, t.Key) {
			taints = append(taints, corev1.Taint{Key: t.Key, Value: t.Value, Effect: t.Effect})
		}
	}
	return labels, taints
}

func selected(prefixes []string, key string) bool {
	if config.ReservedNodeKey(key) {
		return false
	}
	for _, p := range prefixes {
		if p != "" && strings.HasPrefix(key, p) {
			return true
		}
	}
	return false
}

// Decide records the carried labels and taints of replaced members, picks
// each entry's successor and says which Nodes receive what. It is pure:
// the executor patches the Nodes of Apply and stores State.
//
// Pairing: the server does not say which new instance replaces which, so an
// entry's successor is, once Settle has passed since the departure was seen,
// the newest member of the pool that is not departing, was created after the
// departed instance and at most Window before its departure, has no entry
// yet and whose Node (if it has one yet) received nothing before; members of
// the departed one's shard come first. The entry waits for the successor's
// Node, then is applied and dropped. A successor that departs before its Node
// got the entry hands it on when it is itself replaced, and drops it when it
// was scaled down (a pool that shrinks has no successor for it). Entries go
// after TTL, and beyond Max the oldest go.
func Decide(in Input) Decision {
	p := in.Policy
	members := make(map[string]Member, len(in.Members))
	for _, m := range in.Members {
		members[m.Key()] = m
	}
	var d Decision
	entries := make([]Entry, 0, len(in.State.Entries))
	have := map[string]bool{}
	for _, e := range in.State.Entries {
		if p.TTL > 0 && in.Now.Sub(e.Departed) > p.TTL {
			d.Drop = append(d.Drop, Drop{e, DropExpired})
			continue
		}
		entries = append(entries, e)
		have[e.Key()] = true
	}

	// Record every replaced member whose Node has something to carry and
	// no successor's Node received yet (a departing member stays listed
	// while it drains).
	for _, m := range in.Members {
		if m.Node != nil && m.Node.CarriedFrom != "" {
			have[m.Node.CarriedFrom] = true
		}
	}
	for _, e := range in.Departed {
		if !have[e.Key()] && (len(e.Labels) > 0 || len(e.Taints) > 0) {
			entries = append(entries, e)
			have[e.Key()] = true
		}
	}
	for _, m := range in.Members {
		if !m.Departing || !m.Replaced || m.Node == nil || have[m.Key()] {
			continue
		}
		labels, taints := Carried(p, m.Node)
		if len(labels) == 0 && len(taints) == 0 {
			continue
		}
		entries = append(entries, Entry{Shard: m.Shard, Instance: m.ID, Node: m.Node.Name, Created: m.Created,
			Departed: in.Now, Labels: labels, Taints: taints})
		have[m.Key()] = true
	}

	// Successors that went: hand on (replaced) or drop (scaled down, gone).
	kept := entries[:0]
	for _, e := range entries {
		if e.To != "" && !in.Unanswered[shardOf(e.To)] {
			t, ok := members[e.To]
			switch {
			case ok && !t.Departing:
			case ok && t.Replaced && (t.Node == nil || t.Node.CarriedFrom != e.Key()):
				e.To = ""
			case ok && t.Node != nil && t.Node.CarriedFrom == e.Key():
				// Applied before it went; nothing left to do.
				d.Drop = append(d.Drop, Drop{e, DropDone})
				continue
			default:
				d.Drop = append(d.Drop, Drop{e, DropSuccessorGone})
				continue
			}
		}
		kept = append(kept, e)
	}
	entries = kept
	sortEntries(entries)

	// Choose successors, oldest departure first.
	taken := map[string]bool{}
	for _, e := range entries {
		if e.To != "" {
			taken[e.To] = true
		}
	}
	for i := range entries {
		e := &entries[i]
		if e.To != "" || in.Unanswered[e.Shard] || in.Now.Sub(e.Departed) < p.Settle {
			continue
		}
		var best *Member
		for j := range in.Members {
			c := &in.Members[j]
			if c.Departing || taken[c.Key()] || have[c.Key()] || c.Key() == e.Key() ||
				!c.Created.After(e.Created) || c.Created.Before(e.Departed.Add(-p.Window)) ||
				(c.Node != nil && c.Node.CarriedFrom != "") {
				continue
			}
			if best == nil || better(*c, *best, e.Shard) {
				best = c
			}
		}
		if best != nil {
			e.To = best.Key()
			taken[e.To] = true
		}
	}

	// Apply entries whose successor has its Node.
	kept = entries[:0]
	for _, e := range entries {
		t, ok := members[e.To]
		if e.To == "" || !ok || t.Node == nil {
			kept = append(kept, e)
			continue
		}
		if t.Node.CarriedFrom == e.Key() {
			d.Drop = append(d.Drop, Drop{e, DropDone})
			continue
		}
		d.Apply = append(d.Apply, give(e, t.Node))
	}
	entries = kept

	if p.Max > 0 && len(entries) > p.Max {
		// Newest departures stay.
		cut := len(entries) - p.Max
		for _, e := range entries[:cut] {
			d.Drop = append(d.Drop, Drop{e, DropBound})
		}
		entries = slices.Clone(entries[cut:])
	}
	if len(entries) == 0 {
		entries = nil
	}
	d.State = State{Entries: entries}
	return d
}

// better orders successor candidates: the departed one's shard first, then
// the newest, then by key.
func better(a, b Member, shard string) bool {
	if (a.Shard == shard) != (b.Shard == shard) {
		return a.Shard == shard
	}
	if !a.Created.Equal(b.Created) {
		return a.Created.After(b.Created)
	}
	return a.Key() < b.Key()
}

// give computes what n lacks of e.
func give(e Entry, n *Node) Apply {
	a := Apply{Node: n.Name, Entry: e}
	for _, k := range slices.Sorted(maps.Keys(e.Labels)) {
		v := e.Labels[k]
		if have, ok := n.Labels[k]; ok {
			if have != v {
				a.Conflicts = append(a.Conflicts, k)
			}
			continue
		}
		if a.Labels == nil {
			a.Labels = map[string]string{}
		}
		a.Labels[k] = v
	}
	for _, t := range e.Taints {
		if !slices.ContainsFunc(n.Taints, func(x corev1.Taint) bool { return x.Key == t.Key && x.Effect == t.Effect }) {
			a.Taints = append(a.Taints, t)
		}
	}
	return a
}

func sortEntries(es []Entry) {
	slices.SortStableFunc(es, func(a, b Entry) int {
		return cmp.Or(a.Departed.Compare(b.Departed), strings.Compare(a.Key(), b.Key()))
	})
}

func shardOf(key string) string {
	s, _, _ := strings.Cut(key, "/")
	return s
}
