package mock

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/nstance-dev/nstance/internal/server/provider"
)

// Provider keeps instances in a map. The zero value is not usable; call New.
type Provider struct {
	mu        sync.Mutex
	instances map[string]provider.Instance
	requests  map[string]provider.CreateRequest
	creates   int
	deletes   int
	statuses  int
	// failCreate, when set, is consulted before every create.
	failCreate func(provider.CreateRequest) error
}

var _ provider.Provider = (*Provider)(nil)

// New returns an empty mock provider.
func New() *Provider {
	return &Provider{instances: map[string]provider.Instance{}, requests: map[string]provider.CreateRequest{}}
}

// FailCreate installs f; a non-nil error from f fails that create. Pass nil to clear.
func (p *Provider) FailCreate(f func(provider.CreateRequest) error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.failCreate = f
}

// Create implements provider.Provider.
func (p *Provider) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	if err := provider.ValidateInstanceID(req.InstanceID); err != nil {
		return provider.Instance{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if inst, ok := p.instances[req.InstanceID]; ok {
		return inst, nil
	}
	if p.failCreate != nil {
		if err := p.failCreate(req); err != nil {
			return provider.Instance{}, fmt.Errorf("mock create %s: %w", req.InstanceID, err)
		}
	}
	inst := provider.Instance{InstanceID: req.InstanceID, ProviderID: req.ProviderID, State: provider.StateRunning, Addresses: []string{"127.0.0.1"}}
	p.instances[req.InstanceID] = inst
	p.requests[req.InstanceID] = req
	p.creates++
	return inst, nil
}

// Status implements provider.Provider.
func (p *Provider) Status(ctx context.Context, id string) (provider.Instance, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.statuses++
	inst, ok := p.instances[id]
	if !ok {
		return provider.Instance{}, fmt.Errorf("mock status %s: %w", id, provider.ErrNotFound)
	}
	return inst, nil
}

// List implements provider.Provider, sorted by instance id.
func (p *Provider) List(ctx context.Context) ([]provider.Instance, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]provider.Instance, 0, len(p.instances))
	for _, inst := range p.instances {
		out = append(out, inst)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].InstanceID < out[j].InstanceID })
	return out, nil
}

// Delete implements provider.Provider.
func (p *Provider) Delete(ctx context.Context, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.instances[id]; ok {
		delete(p.instances, id)
		delete(p.requests, id)
		p.deletes++
	}
	return nil
}

// Vanish removes an instance as if its VM went away outside the server
// (terminated in the console, a host failure): not counted as a delete.
func (p *Provider) Vanish(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.instances, id)
	delete(p.requests, id)
}

// Statuses counts the Status calls answered so far.
func (p *Provider) Statuses() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.statuses
}

// Stop marks an instance stopped, as if its workload exited.
func (p *Provider) Stop(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if inst, ok := p.instances[id]; ok {
		inst.State = provider.StateStopped
		inst.Message = "stopped by test"
		p.instances[id] = inst
	}
}

// Request returns the create request an existing instance was made from.
func (p *Provider) Request(id string) (provider.CreateRequest, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.requests[id]
	return r, ok
}

// Counts returns how many creates and deletes took effect.
func (p *Provider) Counts() (creates, deletes int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.creates, p.deletes
}
