// Package loadbalancer defines how the shard server registers group members
// with load balancers: the Provider one load_balancers entry is driven
// through, the kinds that build providers (aws, haproxy) and their registry.
//
// The server registers an instance with every load balancer of its group
// after the instance's first healthy report, and on its removal deregisters it
// first, waits the entry's DeregistrationDelay, calls Remove, and only then
// drains its Node and terminates it. On leadership start it compares Members
// with the group members and registers the missing and removes the strangers
// (targets that carry this shard's ownership but belong to no active
// member); targets without our ownership are never touched.
package loadbalancer

import (
	"context"
	"errors"
	"time"
)

// ErrNotFound may be returned (wrapped) by Deregister and Remove when the
// target is not registered; callers treat it as done.
var ErrNotFound = errors.New("target not registered with the load balancer")

// Target is one instance as a load balancer sees it.
type Target struct {
	// InstanceID is the Nstance instance id ({group}-{8 hex}); kinds derive
	// their target's name from it (haproxy: the server name).
	InstanceID string
	Tenant     string
	Group      string
	// Addresses are the instance's IP addresses as its infrastructure
	// provider reported them, the first being the primary one.
	Addresses []string
}

// MemberState is a target's state at the load balancer.
type MemberState string

// Member states.
const (
	// MemberActive: receives new connections (healthy or not: the load
	// balancer's own health check decides).
	MemberActive MemberState = "active"
	// MemberDraining: deregistered, finishing its connections; receives no
	// new ones.
	MemberDraining MemberState = "draining"
	// MemberInactive: registered but receives nothing (e.g. HAProxy
	// maintenance), not draining.
	MemberInactive MemberState = "inactive"
)

// Member is one target the load balancer holds with this shard's
// ownership.
type Member struct {
	InstanceID string
	State      MemberState
	// Detail is the load balancer's own wording, e.g. its health state.
	Detail string
}

// Provider drives one load_balancers entry. Implementations are safe for
// concurrent use and idempotent: registering a registered target, or
// deregistering or removing a target that is not there, succeeds.
type Provider interface {
	// Register adds the target so that it receives new connections (a
	// target left draining or inactive becomes active again).
	Register(ctx context.Context, t Target) error
	// Deregister stops new connections to the target; the ones it has go on
	// for DeregistrationDelay.
	Deregister(ctx context.Context, t Target) error
	// Remove takes the target out for good once its delay has passed (AWS
	// does this by itself after the target group's deregistration delay;
	// HAProxy deletes the server).
	Remove(ctx context.Context, t Target) error
	// Members lists the targets this shard owns (how a kind tells them from
	// foreign ones is its own: HAProxy by the server-name prefix, AWS by the
	// instances' ownership tags). Foreign targets are left out.
	Members(ctx context.Context) ([]Member, error)
	// DeregistrationDelay is how long a deregistered target keeps serving
	// its open connections before Remove (AWS: the target group's
	// deregistration_delay.timeout_seconds; HAProxy: the entry's
	// drain_delay).
	DeregistrationDelay(ctx context.Context) (time.Duration, error)
}
