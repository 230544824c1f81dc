// Package haproxytest runs a real HAProxy for tests: its own configuration
// in a temporary directory, an admin runtime API socket, one HTTP frontend
// on a loopback port per backend, stopped by its PID when the test ends.
package haproxytest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nstance-dev/nstance/internal/testing/hosttools"
	"github.com/nstance-dev/nstance/internal/testing/portpick"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
)

// HAProxy is one running haproxy process.
type HAProxy struct {
	// Socket is the admin runtime API's Unix socket.
	Socket string
	// Frontends are the loopback host:port of each backend's frontend.
	Frontends map[string]string
	// Log holds haproxy's output.
	Log  string
	proc *proctest.Proc
}

// Backend is one backend of the configuration.
type Backend struct {
	Name string
	// Servers are literal "server" lines (foreign servers), e.g.
	// "static1 127.0.0.1:1 disabled".
	Servers []string
}

// Start writes a configuration with the backends and runs haproxy in the
// foreground (-db) until t ends. It fails t when haproxy is not installed
// or its socket does not come up.
func Start(t testing.TB, backends ...Backend) *HAProxy {
	t.Helper()
	bin := hosttools.Require(t, "haproxy")
	// A Unix socket path is limited to 108 bytes: t.TempDir() can be longer.
	dir, err := os.MkdirTemp("", "haproxy")
	if err != nil {
		t.Fatalf("haproxy temp dir: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	h := &HAProxy{Socket: filepath.Join(dir, "admin.sock"), Frontends: map[string]string{}, Log: filepath.Join(dir, "haproxy.log")}
	var b strings.Builder
	fmt.Fprintf(&b, "global\n  stats socket %s level admin\n", h.Socket)
	// Retries and redispatch: a request whose connection fails goes to
	// another server instead of failing the client.
	b.WriteString("defaults\n  mode http\n  retries 3\n  option redispatch\n  timeout connect 1s\n  timeout client 10s\n  timeout server 10s\n")
	var addrs []string
	for _, be := range backends {
		addr := portpick.Addr(t)
		addrs = append(addrs, addr)
		h.Frontends[be.Name] = addr
		fmt.Fprintf(&b, "frontend fe-%s\n  bind %s\n  default_backend %s\n", be.Name, addr, be.Name)
		fmt.Fprintf(&b, "backend %s\n  balance roundrobin\n", be.Name)
		for _, s := range be.Servers {
			fmt.Fprintf(&b, "  server %s\n", s)
		}
	}
	cfg := filepath.Join(dir, "haproxy.cfg")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o600); err != nil {
		t.Fatalf("haproxy config: %v", err)
	}
	p, err := proctest.Start("haproxy", h.Log, dir, nil, bin, "-f", cfg, "-db")
	if err != nil {
		t.Fatalf("start haproxy: %v", err)
	}
	h.proc = p
	t.Cleanup(func() { p.Stop(5 * time.Second) })
	if err := p.WaitFor(t.Context(), "haproxy's runtime API socket", 20*time.Second, func() bool {
		c, err := net.DialTimeout("unix", h.Socket, time.Second)
		if err != nil {
			return false
		}
		_ = c.Close()
		return proctest.Dialable(addrs...)
	}); err != nil {
		t.Fatalf("%v\nconfig:\n%s", err, b.String())
	}
	return h
}

// Pid is the haproxy process's PID.
func (h *HAProxy) Pid() int { return h.proc.Pid() }
