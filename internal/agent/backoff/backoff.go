package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff yields growing delays between Min and Max. It is not safe for
// concurrent use; each retry loop owns one.
type Backoff struct {
	Min, Max time.Duration
	// Jitter is the fraction (0..1) by which a delay is randomly shortened.
	Jitter  float64
	attempt int
}

// Next returns the delay before the next attempt and advances the sequence.
func (b *Backoff) Next() time.Duration {
	d := b.Min
	for i := 0; i < b.attempt && d < b.Max; i++ {
		d *= 2
	}
	if d > b.Max {
		d = b.Max
	}
	b.attempt++
	if b.Jitter > 0 && d > 0 {
		d -= time.Duration(rand.Float64() * b.Jitter * float64(d))
	}
	return d
}

// Reset starts the sequence again from Min.
func (b *Backoff) Reset() { b.attempt = 0 }

// Wait sleeps for the next delay or until ctx ends, returning ctx.Err() then.
func (b *Backoff) Wait(ctx context.Context) error {
	t := time.NewTimer(b.Next())
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
