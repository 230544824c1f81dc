package leaderaddr

import "context"

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
