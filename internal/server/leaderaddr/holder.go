package leaderaddr

import (
	"context"
	"math"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Holder makes this server hold the shard's fixed address while it leads.
type Holder interface {
	// Acquire runs after winning the shard election, before serving: make
	// this server hold the shard's fixed address.
	Acquire(ctx context.Context) error
	// Release runs on step-down and shutdown: give the address up (best
	// effort, bounded by ctx). It is also called at start, so an address
	// left behind by a killed earlier run is not held by a standby.
	Release(ctx context.Context) error
}

// None is the mode without a fixed address.
type None struct{}

// Acquire does nothing.
func (None) Acquire(context.Context) error { return nil }

// Release does nothing.
func (None) Release(context.Context) error { return nil }

// DefaultSettle paces a cloud holder's looks while its change settles.
var DefaultSettle = wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.1, Cap: 5 * time.Second}

// Settle runs cond with b (zero Duration: DefaultSettle) until it is done,
// fails or ctx ends (ctx bounds the whole wait); with no Steps the delay
// grows to b.Cap and stays there. The cloud holders (aws.ENI, gcp.AliasIP)
// wait for an attachment or an alias range with it.
func Settle(ctx context.Context, b wait.Backoff, cond wait.ConditionWithContextFunc) error {
	if b.Duration <= 0 {
		b = DefaultSettle
	}
	if b.Steps <= 0 {
		b.Steps = math.MaxInt32
	}
	return b.DelayFunc().Until(ctx, true, false, cond)
}
