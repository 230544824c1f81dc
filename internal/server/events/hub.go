package events

import (
	"errors"
	"sync"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// ErrSlow ends a subscription whose consumer fell behind by a full buffer.
var ErrSlow = errors.New("watcher fell too far behind and was disconnected; reconnect and resynchronise")

// ErrClosed ends every subscription when the hub shuts down.
var ErrClosed = errors.New("event hub closed")

// DefaultBuffer is the per-subscriber buffer when none is given.
const DefaultBuffer = 1024

// Hub delivers events of type T to per-tenant subscribers.
type Hub[T any] struct {
	buffer int
	mu     sync.Mutex
	subs   map[string]map[*Sub[T]]struct{}
	closed bool
}

// NewHub returns a hub whose subscribers buffer up to buffer events (DefaultBuffer when <= 0).
func NewHub[T any](buffer int) *Hub[T] {
	if buffer <= 0 {
		buffer = DefaultBuffer
	}
	return &Hub[T]{buffer: buffer, subs: map[string]map[*Sub[T]]struct{}{}}
}

// Sub is one subscription.
type Sub[T any] struct {
	hub    *Hub[T]
	tenant string
	ch     chan T
	done   chan struct{}
	err    error
}

// Subscribe registers a subscriber for tenant.
func (h *Hub[T]) Subscribe(tenant string) *Sub[T] {
	s := &Sub[T]{hub: h, tenant: tenant, ch: make(chan T, h.buffer), done: make(chan struct{})}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		s.err = ErrClosed
		close(s.done)
		return s
	}
	m := h.subs[tenant]
	if m == nil {
		m = map[*Sub[T]]struct{}{}
		h.subs[tenant] = m
	}
	m[s] = struct{}{}
	return s
}

// Events delivers the subscription's events in publish order.
func (s *Sub[T]) Events() <-chan T { return s.ch }

// Done is closed when the hub ends the subscription (slow consumer or shutdown).
func (s *Sub[T]) Done() <-chan struct{} { return s.done }

// Err says why the subscription ended; valid after Done is closed.
func (s *Sub[T]) Err() error {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	return s.err
}

// Close unsubscribes. Safe to call more than once.
func (s *Sub[T]) Close() {
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	s.hub.removeLocked(s, nil)
}

func (h *Hub[T]) removeLocked(s *Sub[T], err error) {
	m := h.subs[s.tenant]
	if _, ok := m[s]; !ok {
		return
	}
	delete(m, s)
	if len(m) == 0 {
		delete(h.subs, s.tenant)
	}
	s.err = err
	close(s.done)
}

// Publish delivers ev to every subscriber of tenant and reports how many got it.
func (h *Hub[T]) Publish(tenant string, ev T) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.publishLocked(tenant, ev)
}

func (h *Hub[T]) publishLocked(tenant string, ev T) int {
	n := 0
	for s := range h.subs[tenant] {
		select {
		case s.ch <- ev:
			n++
		default:
			h.removeLocked(s, ErrSlow)
		}
	}
	return n
}

// Subscribers returns the number of subscribers of tenant.
func (h *Hub[T]) Subscribers(tenant string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs[tenant])
}

// Close ends every subscription with ErrClosed.
func (h *Hub[T]) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	for _, m := range h.subs {
		for s := range m {
			h.removeLocked(s, ErrClosed)
		}
	}
}

// Hubs are the three event streams of the Operator API.
type Hubs struct {
	Groups    *Hub[*nstancev1.GroupEvent]
	Instances *Hub[*nstancev1.InstanceEvent]
	Errors    *Hub[*nstancev1.ErrorEvent]
}

// NewHubs returns hubs with the given per-subscriber buffer.
func NewHubs(buffer int) *Hubs {
	return &Hubs{
		Groups:    NewHub[*nstancev1.GroupEvent](buffer),
		Instances: NewHub[*nstancev1.InstanceEvent](buffer),
		Errors:    NewHub[*nstancev1.ErrorEvent](buffer),
	}
}

// Close closes all three hubs.
func (h *Hubs) Close() {
	h.Groups.Close()
	h.Instances.Close()
	h.Errors.Close()
}
