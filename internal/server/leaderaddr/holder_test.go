package leaderaddr

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Settle keeps looking past the backoff's own steps (a holder waits as
// long as its context allows), stops at the first done or error, and ends
// with the context.
func TestSettle(t *testing.T) {
	fast := wait.Backoff{Duration: time.Microsecond, Factor: 2, Cap: 50 * time.Microsecond}
	calls := 0
	require.NoError(t, Settle(context.Background(), fast, func(context.Context) (bool, error) {
		calls++
		return calls == 40, nil
	}))
	require.Equal(t, 40, calls, "no Steps: it does not give up after a few")

	boom := errors.New("refused")
	calls = 0
	require.ErrorIs(t, Settle(context.Background(), fast, func(context.Context) (bool, error) {
		calls++
		return false, boom
	}), boom)
	require.Equal(t, 1, calls)

	ctx, cancel := context.WithCancel(context.Background())
	calls = 0
	err := Settle(ctx, fast, func(context.Context) (bool, error) {
		if calls++; calls == 3 {
			cancel()
		}
		return false, nil
	})
	require.True(t, wait.Interrupted(err), "%v", err)
	require.Equal(t, 3, calls)
}
