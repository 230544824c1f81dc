// Package bindtest checks, for tests of the development servers, which
// addresses a child process listens on: the socket's bound address from
// /proc/<pid>/net/tcp{,6}, and whether connections to the machine's
// non-loopback addresses reach it.
package bindtest

import (
	"bufio"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// NonLoopbackIPs returns the machine's addresses that are neither loopback
// nor link-local (those need a zone and are not how other hosts reach us).
func NonLoopbackIPs() ([]net.IP, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	var out []net.IP
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			return nil, fmt.Errorf("addresses of %s: %w", ifc.Name, err)
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok || ipn.IP.IsLoopback() || ipn.IP.IsLinkLocalUnicast() || ipn.IP.IsLinkLocalMulticast() {
				continue
			}
			out = append(out, ipn.IP)
		}
	}
	return out, nil
}

// ListeningIPs returns the local addresses process pid listens on at port
// (TCP, IPv4 and IPv6), read from /proc/<pid>/net.
func ListeningIPs(pid, port int) ([]net.IP, error) {
	var out []net.IP
	for _, f := range []string{"tcp", "tcp6"} {
		ips, err := listening(fmt.Sprintf("/proc/%d/net/%s", pid, f), port)
		if err != nil {
			return nil, err
		}
		out = append(out, ips...)
	}
	return out, nil
}

func listening(path string, port int) ([]net.IP, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil // no IPv6 on this machine
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []net.IP
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || fields[3] != "0A" { // TCP_LISTEN
			continue
		}
		hostHex, portHex, ok := strings.Cut(fields[1], ":")
		if !ok {
			continue
		}
		p, err := strconv.ParseUint(portHex, 16, 16)
		if err != nil || int(p) != port {
			continue
		}
		raw, err := hex.DecodeString(hostHex)
		if err != nil {
			return nil, fmt.Errorf("%s: address %q: %w", path, hostHex, err)
		}
		// The kernel prints each 32-bit word in host (little-endian) order.
		ip := make(net.IP, len(raw))
		for i := 0; i+4 <= len(raw); i += 4 {
			ip[i], ip[i+1], ip[i+2], ip[i+3] = raw[i+3], raw[i+2], raw[i+1], raw[i]
		}
		out = append(out, ip)
	}
	return out, sc.Err()
}

// RequireLoopbackOnly fails unless process pid listens on port only on
// loopback addresses and a connection to every non-loopback address of the
// machine at that port is refused. With no such address on the machine it
// says so and relies on the bound address alone: a socket bound to
// 127.0.0.1 cannot accept connections addressed elsewhere.
func RequireLoopbackOnly(t *testing.T, pid, port int) {
	t.Helper()
	ips, err := ListeningIPs(pid, port)
	if err != nil {
		t.Fatalf("read listening sockets of pid %d: %v", pid, err)
	}
	if len(ips) == 0 {
		t.Fatalf("pid %d has no listening socket on port %d", pid, port)
	}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			t.Fatalf("pid %d listens on %s port %d: not a loopback address", pid, ip, port)
		}
	}
	others, err := NonLoopbackIPs()
	if err != nil {
		t.Fatal(err)
	}
	if len(others) == 0 {
		t.Logf("this machine has no non-loopback address to connect through; checked the bound address only (%v)", ips)
	}
	for _, ip := range others {
		addr := net.JoinHostPort(ip.String(), strconv.Itoa(port))
		conn, err := net.DialTimeout("tcp", addr, 3*time.Second)
		if err == nil {
			conn.Close()
			t.Fatalf("connection to %s (a non-loopback address) was accepted", addr)
		}
		t.Logf("connection to %s refused as expected: %v", addr, err)
	}
}

// RequireReachable fails unless a connection to every non-loopback address
// at port is accepted (the positive control for RequireLoopbackOnly). It
// returns how many addresses it tried.
func RequireReachable(t *testing.T, port int) int {
	t.Helper()
	others, err := NonLoopbackIPs()
	if err != nil {
		t.Fatal(err)
	}
	for _, ip := range others {
		addr := net.JoinHostPort(ip.String(), strconv.Itoa(port))
		conn, err := net.DialTimeout("tcp", addr, 3*time.Second)
		if err != nil {
			t.Fatalf("connection to %s refused although the server listens on all addresses: %v", addr, err)
		}
		conn.Close()
	}
	return len(others)
}
