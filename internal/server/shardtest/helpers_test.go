package shardtest_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func upsert(t *testing.T, c nstancev1.OperatorServiceClient, id string, size uint32, drain time.Duration) *nstancev1.GroupStatus {
	t.Helper()
	spec := &nstancev1.GroupSpec{GroupId: id, Template: "worker", Size: size}
	if drain > 0 {
		spec.DrainTimeout = durationpb.New(drain)
	}
	resp, err := c.UpsertGroup(ctxT(t), &nstancev1.UpsertGroupRequest{Group: spec})
	require.NoError(t, err)
	return resp.GetGroup()
}

func group(t *testing.T, c nstancev1.OperatorServiceClient, id string) *nstancev1.GroupStatus {
	t.Helper()
	resp, err := c.ListGroups(ctxT(t), &nstancev1.ListGroupsRequest{})
	require.NoError(t, err)
	for _, g := range resp.GetGroups() {
		if g.GetSpec().GetGroupId() == id {
			return g
		}
	}
	return nil
}

// waitGroup waits until the group has n active instances, all running.
func waitGroup(t *testing.T, c nstancev1.OperatorServiceClient, id string, n int) *nstancev1.GroupStatus {
	t.Helper()
	var g *nstancev1.GroupStatus
	require.Eventually(t, func() bool {
		g = group(t, c, id)
		return g != nil && int(g.GetActualSize()) == n && int(g.GetReadyCount()) == n
	}, 20*time.Second, 20*time.Millisecond, "group %s never reached %d running instances (last %v)", id, n, g)
	return g
}

// collector reads a stream into a channel until it ends.
type collector[T any] struct {
	ch  chan T
	err chan error
}

func collect[T any](t *testing.T, recv func() (T, error)) *collector[T] {
	c := &collector[T]{ch: make(chan T, 10000), err: make(chan error, 1)}
	go func() {
		for {
			ev, err := recv()
			if err != nil {
				if err != io.EOF {
					c.err <- err
				}
				close(c.ch)
				return
			}
			c.ch <- ev
		}
	}()
	return c
}

// next returns the next event matching f, failing after timeout.
func (c *collector[T]) next(t *testing.T, timeout time.Duration, f func(T) bool) T {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-c.ch:
			if !ok {
				t.Fatalf("stream ended while waiting for an event")
			}
			if f(ev) {
				return ev
			}
		case <-deadline:
			var zero T
			t.Fatalf("timed out waiting for an event")
			return zero
		}
	}
}

// each waits until every predicate has matched an event, in any order:
// events about different objects come from different reconcile passes, so
// their relative order is not defined. Events matching none are skipped.
func (c *collector[T]) each(t *testing.T, timeout time.Duration, fs ...func(T) bool) {
	t.Helper()
	deadline := time.After(timeout)
	matched := make([]bool, len(fs))
	left := len(fs)
	for left > 0 {
		select {
		case ev, ok := <-c.ch:
			if !ok {
				t.Fatalf("stream ended while waiting for events")
			}
			for i, f := range fs {
				if !matched[i] && f(ev) {
					matched[i] = true
					left--
				}
			}
		case <-deadline:
			t.Fatalf("timed out waiting for events: matched %v", matched)
		}
	}
}

// none checks that no event matching f arrives within d.
func (c *collector[T]) none(t *testing.T, d time.Duration, f func(T) bool) {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case ev, ok := <-c.ch:
			if !ok {
				return
			}
			require.False(t, f(ev), "unexpected event %v", ev)
		case <-deadline:
			return
		}
	}
}
