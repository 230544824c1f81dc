//go:build linux

package leaderaddr

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/vishvananda/netlink"
	"k8s.io/apimachinery/pkg/util/wait"
)

// heldVIP is the state of an acquired VIP: the netlink handle and link it
// was added with (bound to this process's network namespace at Acquire) and
// the refresh loop.
type heldVIP struct {
	h    *netlink.Handle
	link netlink.Link
	stop chan struct{}
	done chan struct{}
}

func (v *VIP) addr(lft int) *netlink.Addr {
	a := &netlink.Addr{IPNet: ipnet(v.Prefix)}
	if lft >= 0 {
		a.ValidLft, a.PreferedLft = lft, lft
	}
	return a
}

// Acquire adds the address to the interface, announces it with gratuitous
// ARP and keeps its lifetime renewed until Release.
func (v *VIP) Acquire(ctx context.Context) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.held != nil {
		return nil
	}
	h, err := netlink.NewHandle()
	if err != nil {
		return fmt.Errorf("leader address: netlink: %w", err)
	}
	link, err := h.LinkByName(v.Interface)
	if err != nil {
		h.Close()
		return fmt.Errorf("leader address: interface %s: %w", v.Interface, err)
	}
	lft := -1
	if v.Until != nil {
		if lft = lifetime(time.Now(), v.Until()); lft < 1 {
			h.Close()
			return fmt.Errorf("leader address: %s: the lease leaves less than a second to hold it", v.Prefix)
		}
	}
	if err := h.AddrReplace(link, v.addr(lft)); err != nil {
		h.Close()
		return fmt.Errorf("leader address: adding %s to %s: %w", v.Prefix, v.Interface, err)
	}
	hv := &heldVIP{h: h, link: link, stop: make(chan struct{}), done: make(chan struct{})}
	v.held = hv
	v.Log.Info("leader address added", "address", v.Prefix.String(), "interface", v.Interface, "lifetime_s", lft)
	if err := v.announce(ctx, link); err != nil {
		// The address is held; neighbours learn it on their next ARP
		// request instead.
		v.Log.Error(err, "announcing the leader address with gratuitous ARP", "address", v.Prefix.Addr().String())
	}
	go v.keep(hv)
	return nil
}

// keep renews the address lifetime from Until every refresh interval until
// hv.stop is closed. While Until leaves less than a second (a renewal of the
// lease is late) the address is removed; once a renewal extends it again
// (the server still leads) the address is added back and announced.
func (v *VIP) keep(hv *heldVIP) {
	defer close(hv.done)
	if v.Until == nil {
		<-hv.stop
		return
	}
	ctx := wait.ContextForChannel(hv.stop)
	present := true
	// The condition never ends the poll: only stop does.
	_ = wait.PollUntilContextCancel(ctx, v.refresh(), false, func(context.Context) (bool, error) {
		lft := lifetime(time.Now(), v.Until())
		switch {
		case lft < 1 && present:
			if err := hv.h.AddrDel(hv.link, v.addr(-1)); err != nil && !missing(err) {
				v.Log.Error(err, "removing the leader address after the lease validity ended", "address", v.Prefix.String())
				return false, nil
			}
			present = false
			v.Log.Info("leader address removed: the lease validity ended", "address", v.Prefix.String())
		case lft < 1:
		case !present:
			if err := hv.h.AddrReplace(hv.link, v.addr(lft)); err != nil {
				v.Log.Error(err, "adding the leader address back after the lease was renewed", "address", v.Prefix.String())
				return false, nil
			}
			present = true
			v.Log.Info("leader address added back: the lease was renewed", "address", v.Prefix.String(), "lifetime_s", lft)
			if err := v.announce(ctx, hv.link); err != nil {
				v.Log.Error(err, "announcing the leader address with gratuitous ARP", "address", v.Prefix.Addr().String())
			}
		default:
			if err := hv.h.AddrReplace(hv.link, v.addr(lft)); err != nil {
				v.Log.Error(err, "renewing the leader address lifetime", "address", v.Prefix.String())
			}
		}
		return false, nil
	})
}

// announce sends gratuitous ARP (a request and a reply for the address
// from itself) so neighbours and switches move the address to this host.
func (v *VIP) announce(ctx context.Context, link netlink.Link) error {
	ifi, err := netlinkIface(link)
	if err != nil {
		return err
	}
	la := link.Attrs()
	c, err := arp.Dial(ifi)
	if err != nil {
		return fmt.Errorf("opening an ARP socket on %s: %w", la.Name, err)
	}
	defer c.Close()
	ip := v.Prefix.Addr()
	req, err := arp.NewPacket(arp.OperationRequest, la.HardwareAddr, ip, ethernet.Broadcast, ip)
	if err != nil {
		return err
	}
	rep, err := arp.NewPacket(arp.OperationReply, la.HardwareAddr, ip, ethernet.Broadcast, ip)
	if err != nil {
		return err
	}
	for i := range v.announcements() {
		if i > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		if err := c.WriteTo(req, ethernet.Broadcast); err != nil {
			return fmt.Errorf("sending gratuitous ARP request: %w", err)
		}
		if err := c.WriteTo(rep, ethernet.Broadcast); err != nil {
			return fmt.Errorf("sending gratuitous ARP reply: %w", err)
		}
	}
	return nil
}

// Release stops renewing and removes the address from the interface (also
// when this process did not add it: a previous run killed while leading).
func (v *VIP) Release(ctx context.Context) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	hv := v.held
	v.held = nil
	var h *netlink.Handle
	var link netlink.Link
	if hv != nil {
		close(hv.stop)
		<-hv.done
		h, link = hv.h, hv.link
		defer h.Close()
	} else {
		var err error
		if h, err = netlink.NewHandle(); err != nil {
			return fmt.Errorf("leader address: netlink: %w", err)
		}
		defer h.Close()
		if link, err = h.LinkByName(v.Interface); err != nil {
			return fmt.Errorf("leader address: interface %s: %w", v.Interface, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := h.AddrDel(link, v.addr(-1)); err != nil {
		if missing(err) {
			return nil
		}
		return fmt.Errorf("leader address: removing %s from %s: %w", v.Prefix, v.Interface, err)
	}
	v.Log.Info("leader address removed", "address", v.Prefix.String(), "interface", v.Interface)
	return nil
}

// Held reports whether the interface carries the address now.
func (v *VIP) Held() (bool, error) {
	h, err := netlink.NewHandle()
	if err != nil {
		return false, err
	}
	defer h.Close()
	return hasAddr(h, v.Interface, v.Prefix.Addr())
}

func hasAddr(h *netlink.Handle, iface string, ip netip.Addr) (bool, error) {
	link, err := h.LinkByName(iface)
	if err != nil {
		return false, err
	}
	as, err := h.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return false, err
	}
	for _, a := range as {
		if got, ok := netip.AddrFromSlice(a.IP); ok && got.Unmap() == ip {
			return true, nil
		}
	}
	return false, nil
}

// missing reports an error deleting an address that is not there.
func missing(err error) bool {
	return errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ESRCH)
}

func netlinkIface(l netlink.Link) (*net.Interface, error) {
	la := l.Attrs()
	if la == nil {
		return nil, errors.New("link without attributes")
	}
	return &net.Interface{Index: la.Index, MTU: la.MTU, Name: la.Name, HardwareAddr: la.HardwareAddr, Flags: la.Flags}, nil
}

func ipnet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}
