package gcp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
	"cloud.google.com/go/compute/metadata"
	"github.com/go-logr/logr"
	"google.golang.org/api/option"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/server/leaderaddr"
)

// DefaultInterface is the network interface the alias range goes on.
const DefaultInterface = "nic0"

// AliasIP holds the shard's fixed address for its leader: a reserved
// internal address (addresses.insert --subnet … --addresses …) that the
// leader carries as a /32 alias IP range on its network interface. Acquire
// takes it off every other instance that carries it (the address's users,
// a previous leader alive or not) and puts it on this one; Release takes
// it off this one. Both are safe to call again after an error; the same
// interface as aws.ENI (leaderaddr.Holder).
type AliasIP struct {
	API API
	// Project and Region of the reserved address Address (its name).
	Project, Region, Address string
	// Zone and Instance are this server's instance; Interface its network
	// interface (default nic0).
	Zone, Instance, Interface string
	// Backoff paces the looks while an update settles; the context bounds
	// the whole wait (zero: 200ms doubling up to 5s).
	Backoff wait.Backoff
	Log     logr.Logger
}

func (a *AliasIP) nic() string {
	if a.Interface == "" {
		return DefaultInterface
	}
	return a.Interface
}

func (a *AliasIP) poll(ctx context.Context, cond wait.ConditionWithContextFunc) error {
	return leaderaddr.Settle(ctx, a.Backoff, cond)
}

// fatalAlias reports errors no wait can cure: the address or this
// instance does not exist, or the request is refused as invalid.
func fatalAlias(err error) bool {
	switch HTTPCode(err) {
	case http.StatusNotFound, http.StatusBadRequest, http.StatusForbidden:
		return true
	}
	return false
}

// cidr returns the reserved address as a /32 range.
func (a *AliasIP) cidr(ctx context.Context) (string, []string, error) {
	addr, err := a.API.GetAddress(ctx, &computepb.GetAddressRequest{Project: a.Project, Region: a.Region, Address: a.Address})
	if err != nil {
		return "", nil, fmt.Errorf("addresses.get %s: %w", a.Address, err)
	}
	if addr.GetAddress() == "" {
		return "", nil, fmt.Errorf("addresses.get %s: no IP address", a.Address)
	}
	return addr.GetAddress() + "/32", addr.GetUsers(), nil
}

// ParseInstanceURL returns the zone and name of an instance URL
// (…/projects/P/zones/Z/instances/N).
func ParseInstanceURL(u string) (zone, name string, ok bool) {
	parts := strings.Split(u, "/")
	for i := 0; i+3 < len(parts); i++ {
		if parts[i] == "zones" && parts[i+2] == "instances" {
			return parts[i+1], parts[i+3], true
		}
	}
	return "", "", false
}

// setAlias puts (on) or takes off the range on instance zone/name's
// interface. It reports whether the instance now is as wanted without
// another update; a missing instance counts as off.
func (a *AliasIP) setAlias(ctx context.Context, zone, name, cidr string, on bool) (bool, error) {
	inst, err := a.API.GetInstance(ctx, &computepb.GetInstanceRequest{Project: a.Project, Zone: zone, Instance: name})
	if NotFound(err) && !on {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("instances.get %s/%s: %w", zone, name, err)
	}
	var ni *computepb.NetworkInterface
	for _, n := range inst.GetNetworkInterfaces() {
		if n.GetName() == a.nic() {
			ni = n
		}
	}
	if ni == nil {
		return false, fmt.Errorf("instance %s/%s: %s: %w", zone, name, a.nic(), errNoInterface)
	}
	ranges, has := withoutRange(ni.GetAliasIpRanges(), cidr)
	if has == on {
		return true, nil
	}
	if on {
		ranges = append(ranges, &computepb.AliasIpRange{IpCidrRange: &cidr})
	}
	// The fingerprint makes a concurrent change of the interface fail
	// (412) instead of being overwritten.
	err = a.API.UpdateNetworkInterface(ctx, &computepb.UpdateNetworkInterfaceInstanceRequest{
		Project: a.Project, Zone: zone, Instance: name, NetworkInterface: a.nic(),
		NetworkInterfaceResource: &computepb.NetworkInterface{AliasIpRanges: ranges, Fingerprint: ni.Fingerprint},
	})
	if err != nil {
		return false, fmt.Errorf("instances.updateNetworkInterface %s/%s: %w", zone, name, err)
	}
	return false, nil
}

func withoutRange(rs []*computepb.AliasIpRange, cidr string) ([]*computepb.AliasIpRange, bool) {
	out := make([]*computepb.AliasIpRange, 0, len(rs))
	has := false
	for _, r := range rs {
		if r.GetIpCidrRange() == cidr {
			has = true
			continue
		}
		out = append(out, r)
	}
	return out, has
}

// Acquire makes this instance carry the address: it is taken off every
// other user first (a previous leader's), then added here; Acquire returns
// once this instance's interface shows it. Transient errors (a
// fingerprint race, the address still in use while the old holder's update
// runs) are retried until ctx ends.
func (a *AliasIP) Acquire(ctx context.Context) error {
	var last error
	err := a.poll(ctx, func(ctx context.Context) (bool, error) {
		cidr, users, err := a.cidr(ctx)
		if err != nil {
			if fatalAlias(err) {
				return false, err
			}
			last = err
			return false, nil
		}
		for _, u := range users {
			zone, name, ok := ParseInstanceURL(u)
			if !ok || (zone == a.Zone && name == a.Instance) {
				continue
			}
			if _, err := a.setAlias(ctx, zone, name, cidr, false); err != nil {
				last = err
				return false, nil
			}
			a.Log.Info("took the shard's address off the previous holder", "address", cidr, "holder", zone+"/"+name)
		}
		done, err := a.setAlias(ctx, a.Zone, a.Instance, cidr, true)
		switch {
		case err != nil && (errors.Is(err, errNoInterface) || HTTPCode(err) == http.StatusNotFound):
			return false, err
		case err != nil:
			last = err
			return false, nil
		case !done:
			a.Log.Info("adding the shard's address as an alias IP range", "address", cidr, "instance", a.Instance)
		}
		return done, nil
	})
	if err != nil {
		if last != nil {
			return fmt.Errorf("acquiring %s for %s: %w (last: %v)", a.Address, a.Instance, err, last)
		}
		return fmt.Errorf("acquiring %s for %s: %w", a.Address, a.Instance, err)
	}
	return nil
}

// Release takes the address off this instance (if it carries it) and
// waits, until ctx ends, for the interface to show it gone.
func (a *AliasIP) Release(ctx context.Context) error {
	var last error
	err := a.poll(ctx, func(ctx context.Context) (bool, error) {
		cidr, _, err := a.cidr(ctx)
		if err != nil {
			if fatalAlias(err) {
				return false, err
			}
			last = err
			return false, nil
		}
		done, err := a.setAlias(ctx, a.Zone, a.Instance, cidr, false)
		if err != nil {
			last = err
			return false, nil
		}
		if !done {
			a.Log.Info("released the shard's address", "address", cidr, "instance", a.Instance)
		}
		return done, nil
	})
	if err != nil {
		if last != nil {
			return fmt.Errorf("releasing %s from %s: %w (last: %v)", a.Address, a.Instance, err, last)
		}
		return fmt.Errorf("releasing %s from %s: %w", a.Address, a.Instance, err)
	}
	return nil
}

// AliasConfig describes the alias holder of this server
// (shard.leader_address mode gcp-alias-ip).
type AliasConfig struct {
	// Address is the reserved internal address: its name (in Project and
	// Region) or projects/P/regions/R/addresses/NAME.
	Address string
	// Project, Region, Zone and Instance of this server; empty: from the
	// metadata server.
	Project, Region, Zone, Instance string
	// Endpoint overrides the Compute Engine endpoint.
	Endpoint string
	Log      logr.Logger
}

// NewAliasIP returns the alias holder for this server: its project, zone
// and name come from the metadata server unless given, the client from
// the instance's service account.
func NewAliasIP(ctx context.Context, c AliasConfig, opts ...option.ClientOption) (*AliasIP, error) {
	if p := strings.Split(c.Address, "/"); len(p) == 6 && p[0] == "projects" && p[2] == "regions" && p[4] == "addresses" {
		c.Project, c.Region, c.Address = p[1], p[3], p[5]
	}
	if c.Address == "" {
		return nil, fmt.Errorf("gcp alias IP: no reserved address")
	}
	var err error
	get := func(v *string, f func(context.Context) (string, error), what string) {
		if *v != "" || err != nil {
			return
		}
		if *v, err = f(ctx); err != nil {
			err = fmt.Errorf("gcp alias IP: this instance's %s from the metadata server: %w", what, err)
		}
	}
	get(&c.Project, metadata.ProjectIDWithContext, "project")
	get(&c.Zone, metadata.ZoneWithContext, "zone")
	get(&c.Instance, metadata.InstanceNameWithContext, "name")
	if err != nil {
		return nil, err
	}
	if c.Region == "" {
		i := strings.LastIndex(c.Zone, "-")
		if i <= 0 {
			return nil, fmt.Errorf("gcp alias IP: no region in zone %q", c.Zone)
		}
		c.Region = c.Zone[:i]
	}
	if c.Endpoint != "" {
		opts = append([]option.ClientOption{option.WithEndpoint(c.Endpoint)}, opts...)
	}
	client, err := NewClient(ctx, opts...)
	if err != nil {
		return nil, err
	}
	return &AliasIP{API: client, Project: c.Project, Region: c.Region, Address: c.Address, Zone: c.Zone, Instance: c.Instance, Log: c.Log}, nil
}
