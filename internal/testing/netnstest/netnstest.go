//go:build linux

// Package netnstest builds small networks of Linux network namespaces for
// tests that run as root: a hub namespace holding a bridge, and hosts, each
// a namespace with one veth interface (eth0) plugged into the bridge. Names
// are unique per test run and everything is deleted in t.Cleanup.
package netnstest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// RequireRoot skips the test unless it runs as root (network namespaces
// need CAP_SYS_ADMIN and CAP_NET_ADMIN).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root to create network namespaces, a bridge and veth pairs (run the test as root)")
	}
}

// Net is a bridge in its own hub namespace.
type Net struct {
	t      testing.TB
	id     string
	Hub    *Host
	Prefix netip.Prefix
	hosts  int
}

// Host is one network namespace.
type Host struct {
	// Name is the namespace name (/run/netns/<Name>, usable with
	// `ip netns exec`).
	Name string
	NS   netns.NsHandle
	// Addr is the host's address on the bridge (eth0; on the hub: br0).
	Addr netip.Addr
}

// New creates the hub namespace with bridge br0 carrying the last host
// address of prefix (a /24 such as 10.77.3.0/24).
func New(t testing.TB, prefix netip.Prefix) *Net {
	t.Helper()
	RequireRoot(t)
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	n := &Net{t: t, id: hex.EncodeToString(b), Prefix: prefix.Masked()}
	hub := n.namespace("hub")
	n.Hub = hub
	hubAddr := lastHost(n.Prefix)
	hub.Addr = hubAddr
	must(t, hub.Do(func() error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("adding bridge: %w", err)
		}
		if err := netlink.AddrAdd(br, &netlink.Addr{IPNet: ipnet(hubAddr, n.Prefix.Bits())}); err != nil {
			return err
		}
		if err := up("lo"); err != nil {
			return err
		}
		return netlink.LinkSetUp(br)
	}))
	return n
}

// Unique returns name made unique for this test run (at most 15
// characters, the Linux interface name limit, when name is short).
func (n *Net) Unique(name string) string { return "nt" + n.id + name }

func (n *Net) namespace(name string) *Host {
	t := n.t
	t.Helper()
	full := n.Unique(name)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	must(t, err)
	defer orig.Close()
	ns, err := netns.NewNamed(full)
	if err != nil {
		_ = netns.Set(orig)
		t.Fatalf("creating network namespace %s: %v", full, err)
	}
	must(t, netns.Set(orig))
	t.Cleanup(func() {
		_ = ns.Close()
		if err := netns.DeleteNamed(full); err != nil {
			t.Errorf("deleting network namespace %s: %v", full, err)
		}
	})
	return &Host{Name: full, NS: ns}
}

// AddHost creates a namespace whose eth0 has the next address of the
// prefix and is plugged into the bridge.
func (n *Net) AddHost(name string) *Host {
	t := n.t
	t.Helper()
	n.hosts++
	addr := n.Prefix.Addr()
	for range n.hosts {
		addr = addr.Next()
	}
	h := n.namespace(name)
	h.Addr = addr
	hubEnd := fmt.Sprintf("v%s%d", n.id, n.hosts)
	// The pair is created in the hub; one end moves into the host.
	must(t, n.Hub.Do(func() error {
		va := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: hubEnd}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(h.NS))}
		if err := netlink.LinkAdd(va); err != nil {
			return fmt.Errorf("adding veth %s: %w", hubEnd, err)
		}
		br, err := netlink.LinkByName("br0")
		if err != nil {
			return err
		}
		link, err := netlink.LinkByName(hubEnd)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetMaster(link, br); err != nil {
			return err
		}
		return netlink.LinkSetUp(link)
	}))
	must(t, h.Do(func() error {
		eth, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(eth, &netlink.Addr{IPNet: ipnet(addr, n.Prefix.Bits())}); err != nil {
			return err
		}
		if err := netlink.LinkSetUp(eth); err != nil {
			return err
		}
		return up("lo")
	}))
	return h
}

// Do runs fn on a thread switched into the namespace (sockets and netlink
// handles created inside stay in it).
func (h *Host) Do(fn func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		return err
	}
	defer orig.Close()
	if err := netns.Set(h.NS); err != nil {
		return fmt.Errorf("entering %s: %w", h.Name, err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			// A thread stuck in the wrong namespace must not run other
			// goroutines: keep it locked so it exits with this one.
			runtime.LockOSThread()
		}
	}()
	return fn()
}

// Handle returns a netlink handle operating in the namespace.
func (h *Host) Handle() (*netlink.Handle, error) { return netlink.NewHandleAt(h.NS) }

// HasAddr reports whether interface iface in the namespace carries ip.
func (h *Host) HasAddr(iface string, ip netip.Addr) (bool, error) {
	nh, err := h.Handle()
	if err != nil {
		return false, err
	}
	defer nh.Close()
	link, err := nh.LinkByName(iface)
	if err != nil {
		return false, err
	}
	as, err := nh.AddrList(link, netlink.FAMILY_V4)
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

// Listen opens a TCP listener inside the namespace.
func (h *Host) Listen(addr string) (net.Listener, error) {
	var ln net.Listener
	err := h.Do(func() error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	return ln, err
}

// Dial opens a TCP connection from inside the namespace.
func (h *Host) Dial(addr string) (net.Conn, error) {
	var c net.Conn
	err := h.Do(func() error {
		var err error
		c, err = net.Dial("tcp", addr)
		return err
	})
	return c, err
}

func up(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	return netlink.LinkSetUp(l)
}

func ipnet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(bits, a.BitLen())}
}

func lastHost(p netip.Prefix) netip.Addr {
	b := p.Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 2
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
