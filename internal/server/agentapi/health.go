package agentapi

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// HealthRecord is what the Tracker knows about one instance.
type HealthRecord struct {
	Ref        Ref
	Received   time.Time
	Reports    uint64
	Last       *nstancev1.HealthReport
	FileErrors int
}

// Tracker is an in-memory HealthSink that keeps the latest report of each
// instance, for health monitoring and status queries. An optional OnReport
// hook sees every report (e.g. to update the instance record).
//
// The latest report is kept in its wire form (a few hundred bytes) and
// decoded by Get: a decoded report is a tree of messages several times that
// size, and a shard keeps one per connected agent.
type Tracker struct {
	OnReport func(ctx context.Context, ref Ref, r *nstancev1.HealthReport, received time.Time)

	mu   sync.Mutex
	last map[string]*trackedRecord
}

// trackedRecord is a HealthRecord with the report encoded.
type trackedRecord struct {
	ref        Ref
	received   time.Time
	reports    uint64
	fileErrors int
	raw        []byte
}

// NewTracker returns an empty Tracker.
func NewTracker() *Tracker { return &Tracker{last: map[string]*trackedRecord{}} }

// RecordHealth implements HealthSink.
func (t *Tracker) RecordHealth(ctx context.Context, ref Ref, r *nstancev1.HealthReport, received time.Time) error {
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
	rec := t.last[ref.InstanceID]
	if rec == nil {
		rec = &trackedRecord{}
		t.last[ref.InstanceID] = rec
	}
	// Reuse the buffer of the previous report when it fits.
	rec.ref, rec.received, rec.fileErrors, rec.raw = ref, received, errs, append(rec.raw[:0], raw...)
	rec.reports++
	t.mu.Unlock()
	if t.OnReport != nil {
		t.OnReport(ctx, ref, r, received)
	}
	return nil
}

// Get returns a copy of the record of one instance.
func (t *Tracker) Get(instanceID string) (HealthRecord, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rec, ok := t.last[instanceID]
	if !ok {
		return HealthRecord{}, false
	}
	c := HealthRecord{Ref: rec.ref, Received: rec.received, Reports: rec.reports, FileErrors: rec.fileErrors, Last: &nstancev1.HealthReport{}}
	if err := proto.Unmarshal(rec.raw, c.Last); err != nil {
		// Encoded by RecordHealth itself; cannot fail short of memory corruption.
		panic(fmt.Sprintf("agentapi: decoding a stored health report: %v", err))
	}
	return c, true
}

// Overdue lists instances (of those given) whose last report is older than
// interval, with the number of whole intervals missed. An instance that never
// reported counts from since.
func (t *Tracker) Overdue(ids []string, since, now time.Time, interval time.Duration) map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := map[string]int{}
	for _, id := range ids {
		from := since
		if rec, ok := t.last[id]; ok && rec.received.After(from) {
			from = rec.received
		}
		if missed := int(now.Sub(from) / interval); missed > 0 {
			out[id] = missed
		}
	}
	return out
}

// LastReport returns when an instance last reported.
func (t *Tracker) LastReport(instanceID string) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	rec, ok := t.last[instanceID]
	if !ok {
		return time.Time{}, false
	}
	return rec.received, true
}

// Reset drops every record (the leadership term that gathered them ended).
func (t *Tracker) Reset() {
	t.mu.Lock()
	defer t.mu.Unlock()
	clear(t.last)
}

// Forget drops an instance.
func (t *Tracker) Forget(instanceID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.last, instanceID)
}

// IDs lists instances with a record, sorted.
func (t *Tracker) IDs() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.last))
	for id := range t.last {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}
