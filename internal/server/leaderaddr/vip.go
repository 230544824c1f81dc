package leaderaddr

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/go-logr/logr"
)

// DefaultRefresh is how often a held VIP's lifetime is renewed.
const DefaultRefresh = 500 * time.Millisecond

// VIP holds an IPv4 address on a Linux interface while leading.
type VIP struct {
	// Interface is the interface name (e.g. eth0).
	Interface string
	// Prefix is the address with its prefix length (10.0.0.10/24).
	Prefix netip.Prefix
	// Until returns how long this server may still hold the address (the
	// shard lease's validity). The address is added with a kernel lifetime
	// ending at or before it, renewed every Refresh, and removed once Until
	// has passed. Nil: no lifetime (the address stays until Release).
	Until func() time.Time
	// Refresh is how often the lifetime is renewed (default DefaultRefresh).
	Refresh time.Duration
	// Announcements is how many gratuitous ARP rounds are sent on Acquire,
	// 100ms apart (default 3).
	Announcements int
	Log           logr.Logger

	mu   sync.Mutex
	held *heldVIP
}

// NewVIP checks interface and address.
func NewVIP(iface, address string, until func() time.Time, log logr.Logger) (*VIP, error) {
	if iface == "" {
		return nil, errors.New("leader address: vip: interface required")
	}
	p, err := netip.ParsePrefix(address)
	if err != nil {
		return nil, fmt.Errorf("leader address: vip: address %q: %w", address, err)
	}
	if !p.Addr().Is4() {
		return nil, fmt.Errorf("leader address: vip: %q is not an IPv4 address", address)
	}
	return &VIP{Interface: iface, Prefix: p, Until: until, Log: log}, nil
}

func (v *VIP) refresh() time.Duration {
	if v.Refresh > 0 {
		return v.Refresh
	}
	return DefaultRefresh
}

func (v *VIP) announcements() int {
	if v.Announcements > 0 {
		return v.Announcements
	}
	return 3
}

// lifetime is the kernel lifetime, in whole seconds rounded down, that ends
// no later than until; 0 means the address may no longer be held.
func lifetime(now, until time.Time) int {
	if until.IsZero() {
		return 0
	}
	return max(int(until.Sub(now)/time.Second), 0)
}
