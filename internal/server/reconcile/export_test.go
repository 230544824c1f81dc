package reconcile

import (
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/util/workqueue"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestTerm is a leadership term driven by the test on its own goroutine:
// no workers and no tickers. Keys run when the test calls RunUntilIdle or
// Advance; delayed keys (drain deadlines, rate limits, retries) and the
// periodic passes (resync, health) run when Advance moves the fake clock
// past their time. The queue is the production one (coalescing,
// exponential retry); only its delays wait for the fake clock.
type TestTerm struct {
	r   *Reconciler
	ctx context.Context
	tm  *term
	q   workqueue.TypedRateLimitingInterface[item]
	d   *syncDelaying
	clk *clocktesting.FakeClock

	nextResync, nextHealth time.Time
}

// StartTestTerm begins a term of r with the term's agents, whose
// Options.Clock must be clk, and runs the first resync (as Run does); it
// ends with the test.
func StartTestTerm(tb testing.TB, ctx context.Context, r *Reconciler, clk *clocktesting.FakeClock, agents Agents) *TestTerm {
	tb.Helper()
	t := &TestTerm{r: r, ctx: ctx, clk: clk}
	r.delaying = func() workqueue.TypedDelayingInterface[item] {
		t.d = &syncDelaying{TypedInterface: workqueue.NewTyped[item](), clk: clk}
		return t.d
	}
	tm, err := r.begin(ctx, agents)
	r.delaying = nil
	if err != nil {
		tb.Fatalf("starting the term: %v", err)
	}
	t.tm, t.q = tm, tm.queue
	tb.Cleanup(func() { r.end(tm) })
	r.resync(ctx)
	t.nextResync = tm.start.Add(r.o.ResyncInterval)
	t.nextHealth = tm.start.Add(r.tuning().HealthInterval / 2)
	return t
}

// End finishes the term (as leadership loss does); a later StartTestTerm
// begins the next one.
func (t *TestTerm) End() { t.r.end(t.tm) }

// TermMemory counts what the running term knows about agents (reported,
// with a notice, with a version; from its live table) and orphans.
func (r *Reconciler) TermMemory() (reporting, notices, versions, orphans int) {
	tm := r.curTerm()
	if tm == nil {
		return 0, 0, 0, 0
	}
	if tm.health != nil {
		for _, id := range tm.health.IDs() {
			reporting++
			if tm.health.Notice(id) != "" {
				notices++
			}
			if tm.health.Version(id) != "" {
				versions++
			}
		}
	}
	return reporting, notices, versions, len(tm.orphans)
}

// maxSteps bounds RunUntilIdle: a key that requeues itself at once forever
// is a bug the test must see, not a hang.
const maxSteps = 100000

// RunUntilIdle processes keys until the queue is empty and no delayed key
// is due at the fake clock's time. It returns how many keys ran.
func (t *TestTerm) RunUntilIdle(tb testing.TB) int {
	tb.Helper()
	n := 0
	for {
		t.d.promote()
		if t.q.Len() == 0 {
			return n
		}
		if n++; n > maxSteps {
			tb.Fatalf("the queue did not go idle after %d keys", maxSteps)
		}
		t.r.processNext(t.ctx, t.q)
	}
}

// Advance moves the fake clock by d in steps: to each delayed key's time
// and each periodic pass on the way, running the queue until idle after
// each step. It returns how many keys ran.
func (t *TestTerm) Advance(tb testing.TB, d time.Duration) int {
	tb.Helper()
	end := t.clk.Now().Add(d)
	n := t.RunUntilIdle(tb)
	for {
		next := end
		if at, ok := t.d.next(); ok && at.Before(next) {
			next = at
		}
		next = earliest(next, t.nextResync, t.nextHealth)
		if next.Before(t.clk.Now()) {
			next = t.clk.Now()
		}
		t.clk.SetTime(next)
		if !t.nextResync.After(next) {
			t.r.resync(t.ctx)
			t.nextResync = next.Add(t.r.o.ResyncInterval)
		}
		if !t.nextHealth.After(next) {
			t.r.healthPass(t.ctx, t.tm)
			t.nextHealth = next.Add(t.r.tuning().HealthInterval / 2)
		}
		n += t.RunUntilIdle(tb)
		if !next.Before(end) {
			return n
		}
	}
}

// Resync runs the periodic pass now and the queue until idle.
func (t *TestTerm) Resync(tb testing.TB) int {
	tb.Helper()
	t.r.resync(t.ctx)
	return t.RunUntilIdle(tb)
}

// HealthPass runs the health pass now and the queue until idle.
func (t *TestTerm) HealthPass(tb testing.TB) int {
	tb.Helper()
	t.r.healthPass(t.ctx, t.tm)
	return t.RunUntilIdle(tb)
}

// Waiting returns how many keys wait for a later time.
func (t *TestTerm) Waiting() int {
	t.d.mu.Lock()
	defer t.d.mu.Unlock()
	return len(t.d.waiting)
}

func earliest(a time.Time, bs ...time.Time) time.Time {
	for _, b := range bs {
		if b.Before(a) {
			a = b
		}
	}
	return a
}

// syncDelaying is the delaying layer of a test term's queue: a delayed key
// waits in a list until the test's goroutine finds the fake clock past its
// time (no timer goroutine). As in workqueue's delaying queue, a key
// already waiting keeps the earlier of its two times.
type syncDelaying struct {
	workqueue.TypedInterface[item]
	clk *clocktesting.FakeClock

	mu      sync.Mutex
	waiting map[item]time.Time
}

func (d *syncDelaying) AddAfter(it item, dur time.Duration) {
	if d.ShuttingDown() {
		return
	}
	if dur <= 0 {
		d.Add(it)
		return
	}
	at := d.clk.Now().Add(dur)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.waiting == nil {
		d.waiting = map[item]time.Time{}
	}
	if cur, ok := d.waiting[it]; !ok || at.Before(cur) {
		d.waiting[it] = at
	}
}

// promote adds the keys whose time came to the queue, earliest first (ties
// by key), so a test runs the same way every time.
func (d *syncDelaying) promote() {
	now := d.clk.Now()
	d.mu.Lock()
	type due struct {
		at time.Time
		it item
	}
	var ds []due
	for it, at := range d.waiting {
		if !at.After(now) {
			ds = append(ds, due{at, it})
			delete(d.waiting, it)
		}
	}
	d.mu.Unlock()
	sort.Slice(ds, func(i, j int) bool {
		if !ds[i].at.Equal(ds[j].at) {
			return ds[i].at.Before(ds[j].at)
		}
		return ds[i].it.String() < ds[j].it.String()
	})
	for _, x := range ds {
		d.Add(x.it)
	}
}

// next returns the earliest time a key waits for.
func (d *syncDelaying) next() (time.Time, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var first time.Time
	for _, at := range d.waiting {
		if first.IsZero() || at.Before(first) {
			first = at
		}
	}
	return first, !first.IsZero()
}
