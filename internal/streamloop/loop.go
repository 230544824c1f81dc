package streamloop

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/clock"
)

// DefaultBackoff spaces reopenings: 100 ms doubling to 5 s, each delay
// stretched by up to its own length at random (so that many clients that
// lost one server do not come back in step).
func DefaultBackoff() wait.Backoff {
	return wait.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Jitter: 1, Steps: 1 << 30, Cap: 5 * time.Second}
}

// DefaultHealthy is how long a stream must have lived for the backoff to
// start over at its first delay.
const DefaultHealthy = 30 * time.Second

// Loop is how one stream is followed.
type Loop struct {
	// Name is the stream's name in logs.
	Name string
	// Backoff spaces reopenings; zero: DefaultBackoff().
	Backoff wait.Backoff
	// Healthy is how long a stream must live for the next failure to start
	// the backoff over; zero: DefaultHealthy.
	Healthy time.Duration
	// Ready, when set, is waited for before each attempt (the connection
	// to the server); an error from it ends Run with that error.
	Ready func(context.Context) error
	// Retry, when set, tells whether the error that ended a stream is worth
	// another attempt; false ends Run with that error.
	Retry func(error) bool
	// OnReopen, when set, is called before every attempt but the first,
	// with the error that ended the previous stream.
	OnReopen func(error)
	// Clock is the time source (nil: the real clock).
	Clock clock.Clock
	Log   logr.Logger
}

// Run calls follow, which holds one stream open until it ends, again and
// again until ctx ends (Run returns nil) or Ready or Retry end it (Run
// returns their error).
func (l Loop) Run(ctx context.Context, follow func(context.Context) error) error {
	clk := l.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	initial := l.Backoff
	if initial.Duration <= 0 {
		initial = DefaultBackoff()
	}
	healthy := l.Healthy
	if healthy <= 0 {
		healthy = DefaultHealthy
	}
	bo := initial
	var last error
	for attempt := 0; ; attempt++ {
		if l.Ready != nil {
			if err := l.Ready(ctx); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
		}
		if attempt > 0 && l.OnReopen != nil {
			l.OnReopen(last)
		}
		opened := clk.Now()
		last = follow(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if l.Retry != nil && !l.Retry(last) {
			return last
		}
		if clk.Since(opened) >= healthy {
			bo = initial
		}
		d := bo.Step()
		l.Log.Info("stream ended; reopening", "stream", l.Name, "reason", errString(last), "after", d.String())
		t := clk.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
	}
}

func errString(err error) string {
	if err == nil {
		return "closed"
	}
	return err.Error()
}
