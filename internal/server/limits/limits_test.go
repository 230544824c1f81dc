package limits_test

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/limits"
)

func TestCounterCapsPerKeyAndForgetsIdleKeys(t *testing.T) {
	c := limits.NewCounter(3)
	var rel []func()
	for i := 0; i < 3; i++ {
		r, ok := c.Acquire("a")
		require.True(t, ok)
		rel = append(rel, r)
	}
	_, ok := c.Acquire("a")
	require.False(t, ok, "fourth holder of a")
	rb, ok := c.Acquire("b")
	require.True(t, ok, "b has its own cap")
	rel[0]()
	rel[0]() // twice is harmless
	require.Equal(t, 2, c.Count("a"))
	r, ok := c.Acquire("a")
	require.True(t, ok)
	r()
	rel[1]()
	rel[2]()
	rb()
	require.Equal(t, 0, c.Keys(), "keys without holders are dropped")
}

func TestCounterConcurrent(t *testing.T) {
	c := limits.NewCounter(10)
	var wg sync.WaitGroup
	var mu sync.Mutex
	held, peak := 0, 0
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if r, ok := c.Acquire("k"); ok {
				mu.Lock()
				held++
				peak = max(peak, held)
				mu.Unlock()
				time.Sleep(time.Millisecond)
				mu.Lock()
				held--
				mu.Unlock()
				r()
			}
		}()
	}
	wg.Wait()
	require.LessOrEqual(t, peak, 10)
	require.Equal(t, 0, c.Keys())
}

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func TestKeyedRateBurstThenRefill(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	r := limits.NewKeyedRate(60, 3, 100, clk.now) // one a second
	for i := 0; i < 3; i++ {
		require.Equal(t, limits.Allowed, r.Allow("10.0.0.1"))
	}
	require.Equal(t, limits.RateExceeded, r.Allow("10.0.0.1"))
	require.Equal(t, limits.Allowed, r.Allow("10.0.0.2"), "another source has its own bucket")
	clk.t = clk.t.Add(time.Second)
	require.Equal(t, limits.Allowed, r.Allow("10.0.0.1"))
	require.Equal(t, limits.RateExceeded, r.Allow("10.0.0.1"))
}

func TestKeyedRateBoundsItsKeySet(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	r := limits.NewKeyedRate(60, 2, 50, clk.now)
	for i := 0; i < 50; i++ {
		require.Equal(t, limits.Allowed, r.Allow(fmt.Sprint("src-", i)))
	}
	// Every tracked bucket is still draining: a new source is refused and
	// the set does not grow, however many new sources try.
	for i := 50; i < 10000; i++ {
		require.Equal(t, limits.TooManyKeys, r.Allow(fmt.Sprint("src-", i)))
	}
	require.Equal(t, 50, r.Keys())
	// Once buckets have refilled they are dropped to make room.
	clk.t = clk.t.Add(2 * time.Second)
	require.Equal(t, limits.Allowed, r.Allow("newcomer"))
	require.Equal(t, 1, r.Keys())
}

func TestKeyedRateReserve(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	r := limits.NewKeyedRate(60, 1, 10, clk.now)
	wait, _, ok := r.Reserve("t")
	require.True(t, ok)
	require.Zero(t, wait)
	wait, cancel, ok := r.Reserve("t")
	require.True(t, ok)
	require.Equal(t, time.Second, wait)
	cancel() // the token goes back: the next reservation waits the same
	wait, _, ok = r.Reserve("t")
	require.True(t, ok)
	require.Equal(t, time.Second, wait)
}

func TestSourceListenerCapsConnectionsPerSource(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln := limits.LimitSources(inner, 2)
	refused := make(chan string, 10)
	ln.OnRefused = func(s string) { refused <- s }
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", inner.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	dial()
	dial()
	s1, s2 := <-accepted, <-accepted
	third := dial()
	require.Equal(t, "127.0.0.1", <-refused)
	// The refused connection is closed by the server.
	require.NoError(t, third.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = third.Read(make([]byte, 1))
	require.Error(t, err)
	require.NotContains(t, err.Error(), "timeout")
	require.Equal(t, 2, ln.Open("127.0.0.1"))
	// Closing one frees its slot.
	require.NoError(t, s1.Close())
	dial()
	s3 := <-accepted
	require.Equal(t, 2, ln.Open("127.0.0.1"))
	s2.Close()
	s3.Close()
	require.Equal(t, 0, ln.Open("127.0.0.1"))
}

func TestSourceIP(t *testing.T) {
	for addr, want := range map[net.Addr]string{
		&net.TCPAddr{IP: net.ParseIP("10.1.2.3"), Port: 5}:                "10.1.2.3",
		&net.TCPAddr{IP: net.ParseIP("::ffff:10.1.2.3"), Port: 5}:         "10.1.2.3",
		&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:aaaa::1"), Port: 5}:    "2001:db8:1:2::/64",
		&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:ffff:1:2:3"), Port: 5}: "2001:db8:1:2::/64",
		&net.UnixAddr{Name: "@sock", Net: "unix"}:                         "@sock",
	} {
		require.Equal(t, want, limits.SourceIP(addr), "%v", addr)
	}
}
