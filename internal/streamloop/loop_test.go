package streamloop

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"
)

// harness runs a Loop whose follow reports each call on opened and ends
// when the test sends its error on ends.
type harness struct {
	clk    *clocktesting.FakeClock
	opened chan time.Time
	ends   chan error
	done   chan error
	reopen chan error
}

func start(t *testing.T, ctx context.Context, l Loop) *harness {
	t.Helper()
	h := &harness{clk: clocktesting.NewFakeClock(time.Unix(1_000_000, 0)), opened: make(chan time.Time, 1),
		ends: make(chan error), done: make(chan error, 1), reopen: make(chan error, 100)}
	l.Clock, l.Log = h.clk, logr.Discard()
	if l.OnReopen == nil {
		l.OnReopen = func(err error) { h.reopen <- err }
	}
	go func() {
		h.done <- l.Run(ctx, func(ctx context.Context) error {
			h.opened <- h.clk.Now()
			select {
			case err := <-h.ends:
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	return h
}

// waitOpened waits for the next attempt.
func (h *harness) waitOpened(t *testing.T) time.Time {
	t.Helper()
	select {
	case at := <-h.opened:
		return at
	case <-time.After(10 * time.Second):
		t.Fatal("no attempt")
	}
	return time.Time{}
}

// waitTimer waits until the loop sleeps on its backoff timer.
func (h *harness) waitTimer(t *testing.T) {
	t.Helper()
	require.Eventually(t, h.clk.HasWaiters, 10*time.Second, time.Millisecond, "the loop never waited")
}

// notOpened checks that no attempt has been made.
func (h *harness) notOpened(t *testing.T) {
	t.Helper()
	select {
	case <-h.opened:
		t.Fatal("reopened before its delay")
	case <-time.After(20 * time.Millisecond):
	}
}

// TestDelaysGrowAndStartOver: each reopening waits the backoff's next
// delay (checked to the millisecond on a fake clock), OnReopen sees the
// error that ended the stream, and a stream that lived DefaultHealthy
// starts the backoff over.
func TestDelaysGrowAndStartOver(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h := start(t, ctx, Loop{Name: "s", Backoff: wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Steps: 10, Cap: 350 * time.Millisecond}})
	h.waitOpened(t)
	for i, d := range []time.Duration{100, 200, 350, 350} {
		h.ends <- fmt.Errorf("end %d", i)
		h.waitTimer(t)
		h.clk.Step(d*time.Millisecond - time.Millisecond)
		h.notOpened(t)
		h.clk.Step(time.Millisecond)
		h.waitOpened(t)
		require.EqualError(t, <-h.reopen, fmt.Sprintf("end %d", i))
	}
	// This stream lives long enough: the next delay is the first again.
	h.clk.Step(DefaultHealthy)
	h.ends <- errors.New("after a while")
	h.waitTimer(t)
	h.clk.Step(99 * time.Millisecond)
	h.notOpened(t)
	h.clk.Step(time.Millisecond)
	h.waitOpened(t)
	require.EqualError(t, <-h.reopen, "after a while")
	cancel()
	require.NoError(t, <-h.done)
}

// TestRetryEndsRun: an error Retry refuses ends Run with it, without a
// reopening.
func TestRetryEndsRun(t *testing.T) {
	final := errors.New("permission denied")
	h := start(t, context.Background(), Loop{Retry: func(err error) bool { return !errors.Is(err, final) }})
	h.waitOpened(t)
	h.ends <- final
	require.ErrorIs(t, <-h.done, final)
	require.Empty(t, h.reopen)
}

// TestReadyGatesEachAttempt: no attempt before Ready returns; its error
// ends Run; ctx ending while waiting ends Run with nil.
func TestReadyGatesEachAttempt(t *testing.T) {
	notReady := errors.New("no connection")
	ready := make(chan error)
	h := start(t, context.Background(), Loop{Ready: func(context.Context) error { return <-ready }})
	h.notOpened(t)
	ready <- nil
	h.waitOpened(t)
	h.ends <- errors.New("broken")
	h.waitTimer(t)
	h.clk.Step(time.Minute)
	ready <- notReady
	require.ErrorIs(t, <-h.done, notReady)
	require.Empty(t, h.reopen, "not reopened: Ready refused")

	ctx, cancel := context.WithCancel(context.Background())
	h = start(t, ctx, Loop{})
	h.waitOpened(t)
	h.ends <- errors.New("broken")
	h.waitTimer(t)
	cancel()
	require.NoError(t, <-h.done)
}
