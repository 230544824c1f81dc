package registration

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/nstance-dev/nstance/internal/nonce"
	"github.com/nstance-dev/nstance/internal/server/instances"
)

// SourcePolicy says how a caller's source address is checked against the
// addresses the provider reported for the instance it registers.
type SourcePolicy struct {
	// Off turns the check off (shard.registration.source_address_check "off").
	Off bool
	// TrustedProxies are networks whose connections are relayed (NAT, a load
	// balancer): a caller from one of them is not checked, since its source
	// address says nothing about the instance behind it.
	TrustedProxies []netip.Prefix
}

// InstanceGate admits agent registrations against what the server knows
// about the instance: its record (tenant, group, shard and state), the key it
// registered with before, and the addresses the provider reported. The agent
// certificate's names come from here, never from the request.
type InstanceGate struct {
	Records *instances.Store
	// ProviderAddresses asks the provider for an instance's addresses when its
	// record holds none yet (the provider call that created it may still be
	// running); optional.
	ProviderAddresses func(ctx context.Context, id string) ([]string, error)
	// Policy returns the source-address policy (read from the live config);
	// nil enforces the check with no trusted proxies.
	Policy func() SourcePolicy
	// Now defaults to time.Now.
	Now func() time.Time
}

// refusal is a definite "this instance may not register": the caller is
// told only that; the reason goes to the server log.
type refusal struct{ reason string }

func (r *refusal) Error() string { return r.reason }

func refuse(format string, args ...any) error { return &refusal{reason: fmt.Sprintf(format, args...)} }

// IsRefusal reports whether err is a definite refusal by the gate (as
// opposed to a storage or provider error worth retrying).
func IsRefusal(err error) bool {
	var r *refusal
	return errors.As(err, &r)
}

// AdmitRequest is one agent registration to check.
type AdmitRequest struct {
	Claims *nonce.Claims
	// KeySHA256 is nonce.KeyFingerprint of the registering key.
	KeySHA256 string
	// Peer is the caller's source address (invalid when unknown).
	Peer netip.Addr
	// Hostname and IPs are what the request asked for; each must be one of
	// the record's names.
	Hostname string
	IPs      []net.IP
}

// Admitted holds the certificate names the record allows.
type Admitted struct {
	DNSNames []string
	IPs      []net.IP
}

// Admit checks req against the instance's record, read from object storage
// (the index may lag at the start of a leadership term). A refusal wraps
// the reason (IsRefusal); other errors are transient.
func (g *InstanceGate) Admit(ctx context.Context, req AdmitRequest) (*Admitted, error) {
	c := req.Claims
	// The leader's index, read from storage only when it lacks the record
	// (at the start of a term it may not hold one the last leader created).
	// A stale copy cannot admit wrongly: Bind writes the record only if it
	// is unchanged in storage, and re-checks state and key on the stored
	// one. The GET this saves was a fifth of a registration's storage work.
	rec, ok := g.Records.Get(c.Subject)
	var err error
	if !ok {
		rec, err = g.Records.Refresh(ctx, c.Subject)
		if errors.Is(err, instances.ErrNotFound) {
			return nil, refuse("instance %s has no record", c.Subject)
		}
		if err != nil {
			return nil, fmt.Errorf("reading the record of %s: %w", c.Subject, err)
		}
	}
	if rec.Tenant != c.Tenant || rec.Shard != c.Shard || rec.GroupID != c.Group {
		return nil, refuse("nonce for %s names tenant %q shard %q group %q; the record has %q %q %q",
			c.Subject, c.Tenant, c.Shard, c.Group, rec.Tenant, rec.Shard, rec.GroupID)
	}
	if !rec.State.Active() {
		return nil, refuse("instance %s is %s", rec.ID, rec.State)
	}
	if rec.Agent != nil && rec.Agent.KeySHA256 != req.KeySHA256 && rec.Agent.NonceID == c.ID {
		// This very nonce registered another key: a replay.
		return nil, fmt.Errorf("%w (jti %s registered instance %s with another key)", nonce.ErrReplayed, c.ID, rec.ID)
	}
	if rec.Agent != nil && rec.Agent.KeySHA256 != req.KeySHA256 {
		return nil, refuse("instance %s is already registered with another key (nonce %s)", rec.ID, rec.Agent.NonceID)
	}
	addrs := rec.Addresses
	if len(addrs) == 0 && g.ProviderAddresses != nil {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		addrs, err = g.ProviderAddresses(pctx, rec.ID)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("asking the provider for the addresses of %s: %w", rec.ID, err)
		}
	}
	adm := &Admitted{DNSNames: []string{rec.ID}}
	for _, a := range addrs {
		if ip := net.ParseIP(a); ip != nil {
			adm.IPs = append(adm.IPs, ip)
		} else if len(a) <= maxHostLength && hostnamePattern.MatchString(a) && !slices.Contains(adm.DNSNames, a) {
			adm.DNSNames = append(adm.DNSNames, a)
		}
	}
	if req.Hostname != "" && !slices.Contains(adm.DNSNames, req.Hostname) {
		return nil, refuse("hostname %q is not a name of instance %s (%v)", req.Hostname, rec.ID, adm.DNSNames)
	}
	for _, ip := range req.IPs {
		if !slices.ContainsFunc(adm.IPs, ip.Equal) {
			return nil, refuse("IP %s is not an address of instance %s (%v)", ip, rec.ID, adm.IPs)
		}
	}
	if err := g.checkSource(req.Peer, rec.ID, adm.IPs); err != nil {
		return nil, err
	}
	return adm, nil
}

func (g *InstanceGate) checkSource(peer netip.Addr, id string, ips []net.IP) error {
	var pol SourcePolicy
	if g.Policy != nil {
		pol = g.Policy()
	}
	if pol.Off || len(ips) == 0 {
		// Nothing known to compare with: the nonce alone vouches.
		return nil
	}
	if !peer.IsValid() {
		return refuse("source address of the caller for %s is unknown", id)
	}
	peer = peer.Unmap()
	for _, p := range pol.TrustedProxies {
		if p.Contains(peer) {
			return nil
		}
	}
	for _, ip := range ips {
		if a, ok := netip.AddrFromSlice(ip); ok && a.Unmap() == peer {
			return nil
		}
	}
	return refuse("source address %s is not an address of instance %s (%v)", peer, id, ips)
}

// BindRequest records a registration on the instance record.
type BindRequest struct {
	Claims    *nonce.Claims
	KeySHA256 string
	Serial    string
	ServerID  string
}

// Bind records the registered key on the instance record, so no other key
// registers this instance (through another of its nonces). Binding the same
// key again changes nothing.
func (g *InstanceGate) Bind(ctx context.Context, req BindRequest) error {
	now := time.Now
	if g.Now != nil {
		now = g.Now
	}
	id := req.Claims.Subject
	update := func() error {
		_, err := g.Records.Update(ctx, id, func(x *instances.Record) error {
			if x.Agent != nil {
				if x.Agent.KeySHA256 == req.KeySHA256 {
					return instances.ErrNoChange
				}
				return refuse("instance %s was registered with another key meanwhile (nonce %s)", id, x.Agent.NonceID)
			}
			if !x.State.Active() {
				return refuse("instance %s became %s", id, x.State)
			}
			x.Agent = &instances.AgentRegistration{KeySHA256: req.KeySHA256, NonceID: req.Claims.ID, Serial: req.Serial,
				RegisteredAt: now().UTC(), RegisteredBy: req.ServerID}
			x.UpdatedAt = now().UTC()
			return nil
		})
		return err
	}
	err := update()
	if errors.Is(err, instances.ErrNotFound) {
		// The index was replaced (a new term's load) since Admit read it.
		if _, rerr := g.Records.Refresh(ctx, id); errors.Is(rerr, instances.ErrNotFound) {
			return refuse("instance %s has no record any more", id)
		} else if rerr != nil {
			return fmt.Errorf("recording the registration of %s: %w", id, rerr)
		}
		err = update()
	}
	if err != nil && !IsRefusal(err) {
		return fmt.Errorf("recording the registration of %s: %w", id, err)
	}
	return err
}
