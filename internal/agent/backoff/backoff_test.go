package backoff

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestNextGrowsAndCaps(t *testing.T) {
	b := &Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	var got []time.Duration
	for range 6 {
		got = append(got, b.Next())
	}
	require.Equal(t, []time.Duration{100, 200, 400, 800, 1000, 1000}, scale(got, time.Millisecond))
	b.Reset()
	require.Equal(t, 100*time.Millisecond, b.Next())
}

func scale(ds []time.Duration, unit time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d / unit
	}
	return out
}

func TestJitterStaysInRange(t *testing.T) {
	b := &Backoff{Min: time.Second, Max: time.Second, Jitter: 0.5}
	for range 100 {
		d := b.Next()
		require.GreaterOrEqual(t, d, 500*time.Millisecond)
		require.LessOrEqual(t, d, time.Second)
	}
}

func TestWaitStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b := &Backoff{Min: time.Hour, Max: time.Hour}
	require.ErrorIs(t, b.Wait(ctx), context.Canceled)
}
