package store

import (
	"errors"
	"fmt"
)

// ExpiredError reports a watch start older than the kept history.
type ExpiredError struct {
	Requested, Oldest uint64
}

func (e *ExpiredError) Error() string {
	return fmt.Sprintf("too old resource version: %d (%d)", e.Requested, e.Oldest)
}

// ErrStopping is returned for watches started while the store shuts down.
var ErrStopping = errors.New("server is shutting down")

// Watcher receives the events of one resource (optionally one namespace).
// When it falls more than the buffer behind, its channel is closed and
// Overflowed reports true: the client must start again, as with
// kube-apiserver.
type Watcher struct {
	resource  string
	namespace string
	ch        chan Event
	s         *Store
	overflow  bool
}

// Events delivers events in resourceVersion order; it is closed when the
// watcher stops or overflows.
func (w *Watcher) Events() <-chan Event { return w.ch }

// Overflowed tells whether the watcher was closed for falling behind.
func (w *Watcher) Overflowed() bool {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	return w.overflow
}

// Stop ends the watch.
func (w *Watcher) Stop() {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	w.s.closeWatcherLocked(w, false)
}

func (s *Store) closeWatcherLocked(w *Watcher, overflow bool) {
	if _, ok := s.watchers[w]; !ok {
		return
	}
	delete(s.watchers, w)
	w.overflow = overflow
	close(w.ch)
}

// WatchStart is the beginning of a watch: events to send first, then the
// live watcher.
type WatchStart struct {
	Watcher *Watcher
	// Initial holds synthetic ADDED events for the current objects (when
	// asked) followed by history newer than the requested resourceVersion.
	Initial []Event
	// RV is the resourceVersion the initial state is consistent with.
	RV uint64
}

// Watch starts a watch on a resource. With sendInitial, every current object
// is delivered as ADDED first; otherwise events newer than fromRV are
// replayed from history (ExpiredError when fromRV is older than the history).
func (s *Store) Watch(res, ns string, fromRV uint64, sendInitial bool) (*WatchStart, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tables[res]
	if t == nil {
		return nil, fmt.Errorf("%s: %w", res, ErrNotRegistered)
	}
	if s.stopping {
		return nil, ErrStopping
	}
	start := &WatchStart{RV: s.rv}
	if sendInitial {
		for k, e := range t.objs {
			_ = k
			ens, name := entryKey(e)
			if ns != "" && t.namespaced && ens != ns {
				continue
			}
			start.Initial = append(start.Initial, Event{Type: "ADDED", Resource: res, Namespace: ens, Name: name, RV: e.RV, Object: e})
		}
		sortEvents(start.Initial)
	} else {
		low := s.lowWater
		if t.lowWater > low {
			low = t.lowWater
		}
		if fromRV < low {
			return nil, &ExpiredError{Requested: fromRV, Oldest: low}
		}
		for _, ev := range s.historyLocked() {
			if ev.RV > fromRV && ev.Resource == res && (ns == "" || ev.Namespace == ns) {
				start.Initial = append(start.Initial, ev)
			}
		}
	}
	w := &Watcher{resource: res, namespace: ns, ch: make(chan Event, s.opts.WatchBuffer), s: s}
	s.watchers[w] = struct{}{}
	start.Watcher = w
	return start, nil
}

func entryKey(e *Entry) (string, string) {
	md, _ := e.Object["metadata"].(map[string]any)
	ns, _ := md["namespace"].(string)
	name, _ := md["name"].(string)
	return ns, name
}

func sortEvents(evs []Event) {
	// Insertion-free ordering by namespace/name keeps initial lists stable.
	sortSlice(evs, func(a, b Event) bool {
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Name < b.Name
	})
}

// historyLocked returns the kept events oldest first.
func (s *Store) historyLocked() []Event {
	if !s.histFull {
		return s.history[:s.histNext]
	}
	out := make([]Event, 0, len(s.history))
	out = append(out, s.history[s.histNext:]...)
	return append(out, s.history[:s.histNext]...)
}

// recordLocked appends an event to history and hands it to watchers; a
// watcher whose buffer is full is closed rather than blocking the server.
func (s *Store) recordLocked(ev Event) Event {
	if s.histFull {
		s.lowWater = s.history[s.histNext].RV
	}
	s.history[s.histNext] = ev
	s.histNext++
	if s.histNext == len(s.history) {
		s.histNext = 0
		s.histFull = true
	}
	for w := range s.watchers {
		if w.resource != ev.Resource || (w.namespace != "" && w.namespace != ev.Namespace) {
			continue
		}
		select {
		case w.ch <- ev:
		default:
			s.log.Info("closing slow watcher", "resource", w.resource, "namespace", w.namespace)
			s.closeWatcherLocked(w, true)
		}
	}
	return ev
}
