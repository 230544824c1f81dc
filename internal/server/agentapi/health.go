package agentapi

import (
	"context"
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
type Tracker struct {
	OnReport func(ctx context.Context, ref Ref, r *nstancev1.HealthReport, received time.Time)

	mu   sync.Mutex
	last map[string]*HealthRecord
}

// NewTracker returns an empty Tracker.
func NewTracker() *Tracker { return &Tracker{last: map[string]*HealthRecord{}} }

// RecordHealth implements HealthSink.
func (t *Tracker) RecordHealth(ctx context.Context, ref Ref, r *nstancev1.HealthReport, received time.Time) error {
	errs := 0
	for _, f := range r.GetFiles() {
		if f.GetState() != nstancev1.FileState_FILE_STATE_OK {
			errs++
		}
	}
	t.mu.Lock()
	rec := t.last[ref.InstanceID]
	if rec == nil {
		rec = &HealthRecord{}
		t.last[ref.InstanceID] = rec
	}
	rec.Ref, rec.Received, rec.Last, rec.FileErrors = ref, received, r, errs
	rec.Reports++
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
	c := *rec
	c.Last = proto.Clone(rec.Last).(*nstancev1.HealthReport)
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
		if rec, ok := t.last[id]; ok && rec.Received.After(from) {
			from = rec.Received
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
	return rec.Received, true
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
