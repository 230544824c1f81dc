package provider

import (
	"context"
	"fmt"
)

// Fence bounds a leader's work by its lease: Bound returns ctx limited to
// the time the leader may still act, or an error when it may not act.
type Fence interface {
	Bound(ctx context.Context) (context.Context, context.CancelFunc, error)
}

// Fenced returns p with its state-changing calls (Create, Delete)
// refused unless f allows it and bounded by f; reads pass
// through. A server that lost its lease therefore creates and deletes
// nothing, even from work that has not noticed yet.
func Fenced(p Provider, f Fence) Provider { return fenced{Provider: p, f: f} }

type fenced struct {
	Provider
	f Fence
}

func (p fenced) Create(ctx context.Context, req CreateRequest) (Instance, error) {
	ctx, cancel, err := p.f.Bound(ctx)
	defer cancel()
	if err != nil {
		return Instance{}, fmt.Errorf("creating an instance: %w", err)
	}
	return p.Provider.Create(ctx, req)
}

func (p fenced) Delete(ctx context.Context, instanceID string) error {
	ctx, cancel, err := p.f.Bound(ctx)
	defer cancel()
	if err != nil {
		return fmt.Errorf("deleting instance %s: %w", instanceID, err)
	}
	return p.Provider.Delete(ctx, instanceID)
}
