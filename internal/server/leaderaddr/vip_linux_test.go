//go:build linux

package leaderaddr

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/mdlayher/arp"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/nstance-dev/nstance/internal/testing/netnstest"
)

var vipPrefix = netip.MustParsePrefix("10.77.0.0/24")

// acquire runs Acquire inside h's namespace (the netlink handle and ARP
// socket are bound to it there).
func acquire(t *testing.T, h *netnstest.Host, v *VIP) {
	t.Helper()
	require.NoError(t, h.Do(func() error { return v.Acquire(context.Background()) }))
}

func held(t *testing.T, h *netnstest.Host, ip netip.Addr) bool {
	t.Helper()
	ok, err := h.HasAddr("eth0", ip)
	require.NoError(t, err)
	return ok
}

// Acquire adds the address and announces it: a neighbour on the bridge
// receives the gratuitous ARP (sender = target = the VIP, from the
// holder's MAC); Release removes it.
func TestVIPAcquireAnnouncesAndReleaseRemoves(t *testing.T) {
	n := netnstest.New(t, vipPrefix)
	a, b := n.AddHost("a"), n.AddHost("b")
	vip := netip.MustParsePrefix("10.77.0.100/24")

	var aMAC string
	require.NoError(t, a.Do(func() error {
		l, err := netlink.LinkByName("eth0")
		aMAC = l.Attrs().HardwareAddr.String()
		return err
	}))
	// A listener on b reads every ARP packet until it sees the VIP's.
	var c *arp.Client
	require.NoError(t, b.Do(func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		ifi, err := netlinkIface(l)
		if err != nil {
			return err
		}
		c, err = arp.Dial(ifi)
		return err
	}))
	t.Cleanup(func() { _ = c.Close() })
	var seen atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			p, _, err := c.Read()
			if err != nil {
				return
			}
			if p.SenderIP == vip.Addr() && p.TargetIP == vip.Addr() && p.SenderHardwareAddr.String() == aMAC {
				seen.Store(true)
				return
			}
		}
	}()

	v, err := NewVIP("eth0", vip.String(), nil, logr.Discard())
	require.NoError(t, err)
	acquire(t, a, v)
	require.True(t, held(t, a, vip.Addr()))
	require.False(t, held(t, b, vip.Addr()))
	<-done
	require.True(t, seen.Load(), "b received a gratuitous ARP for %s from %s", vip.Addr(), aMAC)

	require.NoError(t, a.Do(func() error { return v.Release(context.Background()) }))
	require.False(t, held(t, a, vip.Addr()))
	// Releasing again is harmless.
	require.NoError(t, a.Do(func() error { return v.Release(context.Background()) }))
}

// A server killed while leading leaves its address behind; a new run
// removes it with Release before campaigning.
func TestVIPReleaseRemovesAnAddressLeftBehind(t *testing.T) {
	n := netnstest.New(t, vipPrefix)
	a := n.AddHost("a")
	vip := netip.MustParsePrefix("10.77.0.101/24")
	require.NoError(t, a.Do(func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		return netlink.AddrAdd(l, &netlink.Addr{IPNet: ipnet(vip)})
	}))
	v, err := NewVIP("eth0", vip.String(), nil, logr.Discard())
	require.NoError(t, err)
	require.NoError(t, a.Do(func() error { return v.Release(context.Background()) }))
	require.False(t, held(t, a, vip.Addr()))
}

// The address lives no longer than the lease validity: renewed while
// Until moves forward, removed by the refresh loop once it stops, and by
// the kernel alone when nothing runs any more (a killed or frozen server).
func TestVIPLifetimeFollowsTheLease(t *testing.T) {
	n := netnstest.New(t, vipPrefix)
	a := n.AddHost("a")
	vip := netip.MustParsePrefix("10.77.0.102/24")

	t.Run("renewed while the lease is renewed, removed after", func(t *testing.T) {
		var until atomic.Int64
		until.Store(time.Now().Add(2 * time.Second).UnixNano())
		v, err := NewVIP("eth0", vip.String(), func() time.Time { return time.Unix(0, until.Load()) }, logr.Discard())
		require.NoError(t, err)
		v.Refresh = 100 * time.Millisecond
		acquire(t, a, v)
		// Keep renewing past the first lifetime: the address stays.
		stop := time.Now().Add(3500 * time.Millisecond)
		for time.Now().Before(stop) {
			until.Store(time.Now().Add(2 * time.Second).UnixNano())
			require.True(t, held(t, a, vip.Addr()), "held while the lease is renewed")
			time.Sleep(100 * time.Millisecond)
		}
		// The lease stops being renewed: gone by its validity (+ one
		// refresh and the kernel's one-second rounding).
		end := time.Unix(0, until.Load())
		require.Eventually(t, func() bool { return !held(t, a, vip.Addr()) }, time.Until(end)+1500*time.Millisecond, 20*time.Millisecond)
		// A late renewal (the server still leads) brings it back.
		until.Store(time.Now().Add(3 * time.Second).UnixNano())
		require.Eventually(t, func() bool { return held(t, a, vip.Addr()) }, 2*time.Second, 20*time.Millisecond,
			"added back once the lease is renewed again")
		require.NoError(t, a.Do(func() error { return v.Release(context.Background()) }))
		require.False(t, held(t, a, vip.Addr()))
	})

	t.Run("the kernel removes it when the process stops running", func(t *testing.T) {
		end := time.Now().Add(2500 * time.Millisecond)
		v, err := NewVIP("eth0", vip.String(), func() time.Time { return end }, logr.Discard())
		require.NoError(t, err)
		acquire(t, a, v)
		// Stop the refresh loop without removing anything, as a SIGKILL
		// would.
		v.mu.Lock()
		close(v.held.stop)
		<-v.held.done
		v.held.h.Close()
		v.held = nil
		v.mu.Unlock()
		require.True(t, held(t, a, vip.Addr()))
		require.Eventually(t, func() bool { return !held(t, a, vip.Addr()) }, time.Until(end)+1500*time.Millisecond, 20*time.Millisecond,
			"the kernel drops the address when its lifetime ends")
	})

	t.Run("no validity left", func(t *testing.T) {
		v, err := NewVIP("eth0", vip.String(), func() time.Time { return time.Now().Add(500 * time.Millisecond) }, logr.Discard())
		require.NoError(t, err)
		err = a.Do(func() error { return v.Acquire(context.Background()) })
		require.ErrorContains(t, err, "less than a second")
		require.False(t, held(t, a, vip.Addr()))
	})
}

func TestVIPMissingInterface(t *testing.T) {
	n := netnstest.New(t, vipPrefix)
	a := n.AddHost("a")
	v, err := NewVIP("nosuch0", "10.77.0.103/24", nil, logr.Discard())
	require.NoError(t, err)
	err = a.Do(func() error { return v.Acquire(context.Background()) })
	require.ErrorContains(t, err, "interface nosuch0")
}

func TestNewVIPRejectsBadInput(t *testing.T) {
	_, err := NewVIP("", "10.0.0.1/24", nil, logr.Discard())
	require.ErrorContains(t, err, "interface required")
	_, err = NewVIP("eth0", "10.0.0.1", nil, logr.Discard())
	require.ErrorContains(t, err, "10.0.0.1")
	_, err = NewVIP("eth0", "fd00::1/64", nil, logr.Discard())
	require.ErrorContains(t, err, "not an IPv4")
}
