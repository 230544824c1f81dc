package agentlive

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Ref names the instance a report came from, as its certificate says.
type Ref struct {
	InstanceID, Tenant, Shard, Group string
}

// Record is what the table knows about one instance.
type Record struct {
	Ref Ref
	// Received is when the latest report came, First when the term's first.
	Received, First time.Time
	// Reports counts the reports of this term.
	Reports uint64
	// Last is the latest report (a copy).
	Last *nstancev1.HealthReport
	// FileErrors counts the files of the latest report not in state OK.
	FileErrors int
	// Version is the agent version last reported ("" when none said).
	Version string
	// Notice is the termination notice kind announced ("" when none).
	Notice string
	// Streams is the number of streams the instance has open.
	Streams int
	// ShutdownAt is when the agent first reported that its host is shutting
	// down (a TERMINATION_KIND_SHUTDOWN notice) in this term; zero when it
	// did not, or when a later report came without it (the agent restarted
	// on a host that stayed up).
	ShutdownAt time.Time
	// DisconnectedAt is when the instance's last open stream closed after
	// it had reported; zero while a stream is open.
	DisconnectedAt time.Time
}

// Presence is the light part of a Record the reconciler reads to decide
// whether an instance's VM may be going away.
type Presence struct {
	Streams                    int
	ShutdownAt, DisconnectedAt time.Time
}

// Change is what a report changed that the reconciler acts on.
type Change struct {
	InstanceID string
	// First: the instance's first report of the term.
	First bool
	// NewVersion: the agent reports a version it did not report before.
	NewVersion bool
	// NewNotice: a termination notice of a kind not announced before.
	NewNotice bool
	// Shutdown: the agent reported that its host is shutting down.
	Shutdown bool
	// Disconnected: the instance's last open stream closed.
	Disconnected bool
}

// Table is one term's live table. The zero value is not usable: New.
type Table struct {
	mu       sync.Mutex
	byID     map[string]*entry
	reports  uint64
	onChange func(Change)
	now      func() time.Time
}

// entry keeps the latest report in its wire form (a few hundred bytes):
// a decoded report is a tree of messages several times that size, and a
// shard keeps one per agent. Get decodes it.
type entry struct {
	ref        Ref
	received   time.Time
	first      time.Time
	reports    uint64
	fileErrors int
	raw        []byte
	version    string
	notice     string
	streams    int
	shutdownAt time.Time
	disconnAt  time.Time
}

// New returns an empty table.
func New() *Table { return &Table{byID: map[string]*entry{}, now: time.Now} }

// NewWithClock returns an empty table that stamps disconnections with now.
func NewWithClock(now func() time.Time) *Table { return &Table{byID: map[string]*entry{}, now: now} }

// Subscribe sets the one function told about every Change, called after
// the table is updated and outside its lock. A table has one subscriber
// (the reconciler of its term); a second Subscribe replaces the first.
func (t *Table) Subscribe(f func(Change)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.onChange = f
}

func (t *Table) entry(ref Ref) *entry {
	e := t.byID[ref.InstanceID]
	if e == nil {
		e = &entry{ref: ref}
		t.byID[ref.InstanceID] = e
	}
	return e
}

// RecordHealth stores an accepted report received at the given time.
func (t *Table) RecordHealth(_ context.Context, ref Ref, r *nstancev1.HealthReport, received time.Time) error {
	errs := 0
	for _, f := range r.GetFiles() {
		if f.GetState() != nstancev1.FileState_FILE_STATE_OK {
			errs++
		}
	}
	raw, err := proto.Marshal(r)
	if err != nil {
		return fmt.Errorf("encoding the health report: %w", err)
	}
	t.mu.Lock()
	e := t.entry(ref)
	ch := Change{InstanceID: ref.InstanceID, First: e.reports == 0}
	if ch.First {
		e.first = received
	}
	if v := r.GetAgentVersion(); v != "" && v != e.version {
		e.version, ch.NewVersion = v, true
	}
	switch n := r.GetTermination(); {
	case n.GetKind() == nstancev1.TerminationKind_TERMINATION_KIND_SHUTDOWN:
		// Not a notice the platform gave: the reconciler asks the provider
		// (and replaces after the shutdown grace if it cannot tell).
		if e.shutdownAt.IsZero() {
			e.shutdownAt, ch.Shutdown = received, true
		}
	case n != nil:
		if k := NoticeKind(n.GetKind()); k != e.notice {
			e.notice, ch.NewNotice = k, true
		}
	default:
		// A report without one: the agent that said its host was going
		// down runs on (its process was restarted, the host stayed up).
		e.shutdownAt = time.Time{}
	}
	// Reuse the buffer of the previous report when it fits.
	e.ref, e.received, e.fileErrors, e.raw = ref, received, errs, append(e.raw[:0], raw...)
	e.reports++
	t.reports++
	notify := t.onChange
	t.mu.Unlock()
	if notify != nil && (ch.First || ch.NewVersion || ch.NewNotice || ch.Shutdown) {
		notify(ch)
	}
	return nil
}

// NoticeKind is the name a termination notice kind is recorded under.
func NoticeKind(k nstancev1.TerminationKind) string {
	switch k {
	case nstancev1.TerminationKind_TERMINATION_KIND_SPOT:
		return "spot"
	case nstancev1.TerminationKind_TERMINATION_KIND_MAINTENANCE:
		return "maintenance"
	case nstancev1.TerminationKind_TERMINATION_KIND_SHUTDOWN:
		return "shutdown"
	}
	return "unspecified"
}

// Connect counts an open stream of the instance until release is called
// (once; later calls do nothing). The release that closes an instance's
// last stream, after it reported, is a Disconnected change.
func (t *Table) Connect(ref Ref) (release func()) {
	t.mu.Lock()
	e := t.entry(ref)
	e.streams++
	e.disconnAt = time.Time{}
	t.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			e := t.byID[ref.InstanceID]
			if e == nil {
				t.mu.Unlock()
				return // forgotten meanwhile
			}
			e.streams--
			var notify func(Change)
			switch {
			case e.streams > 0:
			case e.reports == 0:
				delete(t.byID, ref.InstanceID)
			default:
				e.disconnAt, notify = t.now(), t.onChange
			}
			t.mu.Unlock()
			if notify != nil {
				notify(Change{InstanceID: ref.InstanceID, Disconnected: true})
			}
		})
	}
}

// Presence returns whether the instance has streams open, and when it
// reported a host shutdown or lost its last stream (zero: not known).
func (t *Table) Presence(instanceID string) (Presence, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byID[instanceID]
	if !ok {
		return Presence{}, false
	}
	return Presence{Streams: e.streams, ShutdownAt: e.shutdownAt, DisconnectedAt: e.disconnAt}, true
}

// Get returns a copy of what the table knows about one instance.
func (t *Table) Get(instanceID string) (Record, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byID[instanceID]
	if !ok {
		return Record{}, false
	}
	c := Record{Ref: e.ref, Received: e.received, First: e.first, Reports: e.reports, FileErrors: e.fileErrors, Version: e.version,
		Notice: e.notice, Streams: e.streams, ShutdownAt: e.shutdownAt, DisconnectedAt: e.disconnAt, Last: &nstancev1.HealthReport{}}
	if err := proto.Unmarshal(e.raw, c.Last); err != nil {
		// Encoded by RecordHealth itself; cannot fail short of memory corruption.
		panic(fmt.Sprintf("agentlive: decoding a stored health report: %v", err))
	}
	return c, true
}

// LastReport returns when an instance last reported in this term.
func (t *Table) LastReport(instanceID string) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byID[instanceID]
	if !ok || e.reports == 0 {
		return time.Time{}, false
	}
	return e.received, true
}

// Version is the agent version the instance last reported ("" before one).
func (t *Table) Version(instanceID string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.byID[instanceID]; e != nil {
		return e.version
	}
	return ""
}

// Notice is the termination notice kind the instance announced ("" none).
func (t *Table) Notice(instanceID string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.byID[instanceID]; e != nil {
		return e.notice
	}
	return ""
}

// Overdue lists instances (of those given) whose last report is older than
// interval, with the number of whole intervals missed. An instance that never
// reported counts from since.
func (t *Table) Overdue(ids []string, since, now time.Time, interval time.Duration) map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]int{}
	for _, id := range ids {
		from := since
		if e, ok := t.byID[id]; ok && e.reports > 0 && e.received.After(from) {
			from = e.received
		}
		if missed := int(now.Sub(from) / interval); missed > 0 {
			out[id] = missed
		}
	}
	return out
}

// Forget drops an instance (it was deleted). Streams it still has open
// are no longer counted.
func (t *Table) Forget(instanceID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.byID, instanceID)
}

// IDs lists instances that reported in this term, sorted.
func (t *Table) IDs() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.byID))
	for id, e := range t.byID {
		if e.reports > 0 {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// Len is the number of instances the table holds (reported or connected).
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byID)
}

// Connected is the number of instances with at least one open stream.
func (t *Table) Connected() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, e := range t.byID {
		if e.streams > 0 {
			n++
		}
	}
	return n
}

// Reports is the number of reports recorded in this term.
func (t *Table) Reports() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reports
}
