package shardcmd

import (
	"context"
	"errors"
	"sort"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/nstance-dev/nstance/internal/admin/output"
)

// objKey names an object across shards.
type objKey struct{ shard, id string }

// tracker remembers the last state of every watched object and turns new
// states into ADDED / MODIFIED / DELETED events, dropping those that change
// nothing.
type tracker[T proto.Message] struct {
	known map[objKey]T
	id    func(T) string
	row   func(shard string, m T) []string
	// same reports whether b shows nothing new over a (nil: proto.Equal).
	same func(a, b T) bool
}

func newTracker[T proto.Message](id func(T) string, row func(string, T) []string, same func(a, b T) bool) *tracker[T] {
	if same == nil {
		same = func(a, b T) bool { return proto.Equal(a, b) }
	}
	return &tracker[T]{known: map[objKey]T{}, id: id, row: row, same: same}
}

func (t *tracker[T]) event(typ output.EventType, shard string, m T) (output.Event, error) {
	obj, err := output.ShardProto(shard, m)
	if err != nil {
		return output.Event{}, err
	}
	return output.Event{Type: typ, Row: t.row(shard, m), Object: obj}, nil
}

// upsert records m; ok is false when nothing changed.
func (t *tracker[T]) upsert(shard string, m T) (ev output.Event, ok bool, err error) {
	k := objKey{shard, t.id(m)}
	old, had := t.known[k]
	if had && t.same(old, m) {
		return output.Event{}, false, nil
	}
	t.known[k] = m
	typ := output.Added
	if had {
		typ = output.Modified
	}
	ev, err = t.event(typ, shard, m)
	return ev, err == nil, err
}

// remove forgets an object, reporting its last state as DELETED.
func (t *tracker[T]) remove(shard, id string) (ev output.Event, ok bool, err error) {
	k := objKey{shard, id}
	old, had := t.known[k]
	if !had {
		return output.Event{}, false, nil
	}
	delete(t.known, k)
	ev, err = t.event(output.Deleted, shard, old)
	return ev, err == nil, err
}

// sync makes a shard's known objects equal to list (the shard's complete
// current list) and returns the events that takes, sorted by id.
func (t *tracker[T]) sync(shard string, list []T) ([]output.Event, error) {
	type idEvent struct {
		id string
		ev output.Event
	}
	var evs []idEvent
	seen := map[string]bool{}
	for _, m := range list {
		seen[t.id(m)] = true
		ev, ok, err := t.upsert(shard, m)
		if err != nil {
			return nil, err
		}
		if ok {
			evs = append(evs, idEvent{t.id(m), ev})
		}
	}
	for k := range t.known {
		if k.shard != shard || seen[k.id] {
			continue
		}
		ev, ok, err := t.remove(shard, k.id)
		if err != nil {
			return nil, err
		}
		if ok {
			evs = append(evs, idEvent{k.id, ev})
		}
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].id < evs[j].id })
	out := make([]output.Event, len(evs))
	for i, e := range evs {
		out[i] = e.ev
	}
	return out, nil
}

// retryable reports whether a watch should reconnect after err rather than
// give up: the shard restarted, lost its leadership or dropped a slow watcher.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.ResourceExhausted, codes.DeadlineExceeded, codes.Aborted:
		return true
	}
	return false
}

// stopped reports whether err only says the watch was asked to stop.
func stopped(ctx context.Context, err error) bool {
	return ctx.Err() != nil && (errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled || err == nil ||
		errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded)
}

// backoff is the wait before reconnect attempt n (1, 2, ...): 200ms doubling up to 5s.
func backoff(n int) time.Duration {
	d := 200 * time.Millisecond
	for i := 1; i < n && d < 5*time.Second; i++ {
		d *= 2
	}
	return min(d, 5*time.Second)
}

// sleep waits d or until ctx ends; it reports whether the wait completed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
