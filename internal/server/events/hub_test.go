package events_test

import (
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/events"
)

func drain(s *events.Sub[int], n int) []int {
	var out []int
	for i := 0; i < n; i++ {
		select {
		case v := <-s.Events():
			out = append(out, v)
		default:
			return out
		}
	}
	return out
}

func TestEveryWatcherOfTheTenantGetsEveryEvent(t *testing.T) {
	tests := []struct {
		name     string
		watchers int
		events   int
	}{{"one", 1, 5}, {"two", 2, 50}, {"many", 10, 100}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := events.NewHub[int](1000)
			var subs []*events.Sub[int]
			for i := 0; i < tc.watchers; i++ {
				s := h.Subscribe("acme")
				t.Cleanup(s.Close)
				subs = append(subs, s)
			}
			other := h.Subscribe("globex")
			t.Cleanup(other.Close)
			for i := 0; i < tc.events; i++ {
				require.Equal(t, tc.watchers, h.Publish("acme", i))
			}
			want := make([]int, tc.events)
			for i := range want {
				want[i] = i
			}
			for _, s := range subs {
				require.Equal(t, want, drain(s, tc.events+1))
			}
			require.Empty(t, drain(other, 1), "another tenant sees nothing")
		})
	}
}

func TestSlowWatcherIsDisconnectedNotBlocking(t *testing.T) {
	h := events.NewHub[int](4)
	slow := h.Subscribe("t")
	fast := h.Subscribe("t")
	t.Cleanup(slow.Close)
	t.Cleanup(fast.Close)
	var got []int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for v := range fast.Events() {
			got = append(got, v)
			if v == 99 {
				return
			}
		}
	}()
	for i := 0; i < 100; i++ {
		h.Publish("t", i)
		if i%3 == 0 {
			// let the fast consumer keep up
			for len(fast.Events()) > 0 {
				runtime.Gosched()
			}
		}
	}
	wg.Wait()
	require.Len(t, got, 100, "the fast watcher got every event")
	<-slow.Done()
	require.ErrorIs(t, slow.Err(), events.ErrSlow)
	require.Equal(t, 4, len(drain(slow, 10)), "the slow watcher keeps what it had buffered, then ends")
	require.Equal(t, 1, h.Subscribers("t"))
}

func TestPublishReachesOnlyItsTenantAndClose(t *testing.T) {
	h := events.NewHub[string](8)
	a, b := h.Subscribe("a"), h.Subscribe("b")
	require.Equal(t, 1, h.Publish("a", "config invalid"))
	require.Equal(t, "config invalid", <-a.Events())
	select {
	case ev := <-b.Events():
		t.Fatalf("tenant b got tenant a's event %q", ev)
	default:
	}
	h.Close()
	<-a.Done()
	require.ErrorIs(t, a.Err(), events.ErrClosed)
	late := h.Subscribe("a")
	<-late.Done()
	require.ErrorIs(t, late.Err(), events.ErrClosed)
	a.Close()
}
