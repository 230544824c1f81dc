package haproxy_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer/haproxy"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer/haproxy/haproxytest"
	"github.com/nstance-dev/nstance/internal/testing/portpick"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
)

const doc = `{
  "cluster": {"id": "c1"},
  "shard": {"id": "s1", "infra": {"provider": "mock"},
    "bind": {"health_addr": "127.0.0.1:0", "election_addr": "127.0.0.1:0",
      "registration_addr": "127.0.0.1:0", "operator_addr": "127.0.0.1:0", "agent_addr": "127.0.0.1:0"}},
  "load_balancers": {"www": LB},
  "templates": {"t": {"kind": "worker", "load_balancers": ["www"]}},
}`

func newProvider(t *testing.T, lb string) (loadbalancer.Provider, error) {
	t.Helper()
	r := loadbalancer.NewRegistry(haproxy.Kind())
	cfg, err := config.Parse([]byte(strings.Replace(doc, "LB", lb, 1)), r.Check)
	if err != nil {
		return nil, err
	}
	return r.New(context.Background(), loadbalancer.Env{Name: "www", Config: func() *config.Config { return cfg }, Log: logr.Discard()})
}

func TestSettings(t *testing.T) {
	for _, c := range []struct{ lb, want string }{
		{`{"provider": "haproxy", "backend": "www", "port": 80}`, `load_balancers.www.socket: required`},
		{`{"provider": "haproxy", "socket": "rel/path", "backend": "www", "port": 80}`, `load_balancers.www.socket: want an absolute Unix socket path or host:port`},
		{`{"provider": "haproxy", "socket": "/s", "port": 80}`, `load_balancers.www.backend: required`},
		{`{"provider": "haproxy", "socket": "/s", "backend": "w w", "port": 80}`, `load_balancers.www.backend: invalid backend name`},
		{`{"provider": "haproxy", "socket": "/s", "backend": "www"}`, `load_balancers.www.port: want a port between 1 and 65535, got 0`},
		{`{"provider": "haproxy", "socket": "/s", "backend": "www", "port": 80, "server_options": "check; del server www/x"}`, `load_balancers.www.server_options: must not contain`},
		{`{"provider": "haproxy", "socket": "/s", "backend": "www", "port": 80, "server_prefix": "a b"}`, `load_balancers.www.server_prefix: may hold only`},
		{`{"provider": "haproxy", "socket": "/s", "backend": "www", "port": 80, "drain_delay": "-1s"}`, `load_balancers.www.drain_delay: must not be negative`},
		{`{"provider": "haproxy", "socket": "/s", "backend": "www", "port": 80, "timeout": "0s"}`, `load_balancers.www.timeout: must be positive`},
		{`{"provider": "haproxy", "socket": "/s", "backend": "www", "port": 80, "sokcet": "/s"}`, `load_balancers.www.sokcet: unknown key`},
	} {
		_, err := newProvider(t, c.lb)
		require.ErrorContains(t, err, c.want, c.lb)
	}
	p, err := newProvider(t, `{"provider": "haproxy", "socket": "127.0.0.1:9999", "backend": "www", "port": 80}`)
	require.NoError(t, err)
	d, err := p.DeregistrationDelay(context.Background())
	require.NoError(t, err)
	require.Equal(t, haproxy.DefaultDrainDelay, d)
	require.Equal(t, "nstance-s1-web-0a0b0c0d", p.(*haproxy.Provider).ServerName("web-0a0b0c0d"), "the default prefix names the shard")
}

func TestParseServersState(t *testing.T) {
	const head = "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight\n"
	for _, c := range []struct {
		name, out string
		want      []loadbalancer.Member
		err       string
	}{
		{"empty backend", head + "\n", nil, ""},
		{"states", head +
			"3 www 1 static1 127.0.0.1 0 5 1\n" + // foreign: no prefix
			"3 www 2 p-a 127.0.0.2 2 0 1\n" +
			"3 www 3 p-b 127.0.0.3 2 8 1\n" +
			"3 www 4 p-c 127.0.0.4 0 1 1\n" +
			"3 www 5 p-d 127.0.0.5 1 16 1\n" +
			"4 api 1 p-e 127.0.0.6 2 0 1\n" + // another backend
			"3 www 6 p- 127.0.0.7 2 0 1\n", // the bare prefix names no instance
			[]loadbalancer.Member{
				{InstanceID: "a", State: loadbalancer.MemberActive, Detail: "up"},
				{InstanceID: "b", State: loadbalancer.MemberDraining, Detail: "up"},
				{InstanceID: "c", State: loadbalancer.MemberInactive, Detail: "down"},
				{InstanceID: "d", State: loadbalancer.MemberDraining, Detail: "starting"},
			}, ""},
		{"no backend", "Can't find backend.\n\n", nil, "show servers state www: Can't find backend."},
		{"no header", "", nil, "no header"},
		{"bad admin state", head + "3 www 2 p-a 127.0.0.2 2 x 1\n", nil, `server p-a: admin state "x"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := haproxy.ParseServersState(c.out, "www", "p-")
			if c.err != "" {
				require.ErrorContains(t, err, c.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, c.want, got)
		})
	}
}

// backend is an HTTP server on one loopback address that counts requests.
type backend struct {
	addr string
	hits atomic.Int64
}

func serve(t *testing.T, ip string, port int) *backend {
	t.Helper()
	b := &backend{addr: ip}
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		b.hits.Add(1)
		_, _ = io.WriteString(w, ip)
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return b
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url) //nolint:noctx // a test's plain request
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	return string(body)
}

func members(t *testing.T, p loadbalancer.Provider) map[string]loadbalancer.MemberState {
	t.Helper()
	ms, err := p.Members(context.Background())
	require.NoError(t, err)
	out := map[string]loadbalancer.MemberState{}
	for _, m := range ms {
		out[m.InstanceID] = m.State
	}
	return out
}

// TestRealHAProxy drives a real haproxy: registered servers receive
// requests, a deregistered one none, removal deletes it, foreign servers
// are never listed nor touched, and every call is idempotent.
func TestRealHAProxy(t *testing.T) {
	ctx := context.Background()
	h := haproxytest.Start(t, haproxytest.Backend{Name: "www", Servers: []string{"static1 127.0.0.1:1 disabled"}})
	port := portpick.Port(t)
	a, b := serve(t, "127.0.0.2", port), serve(t, "127.0.0.3", port)
	p, err := newProvider(t, fmt.Sprintf(`{"provider": "haproxy", "socket": %q, "backend": "www", "port": %d, "server_options": "check inter 200ms", "drain_delay": "2s"}`, h.Socket, port))
	require.NoError(t, err)
	ta := loadbalancer.Target{InstanceID: "web-0000000a", Addresses: []string{a.addr}}
	tb := loadbalancer.Target{InstanceID: "web-0000000b", Addresses: []string{b.addr, "10.9.9.9"}}

	require.Empty(t, members(t, p), "the foreign server is not ours")
	require.NoError(t, p.Register(ctx, ta))
	require.NoError(t, p.Register(ctx, tb))
	require.NoError(t, p.Register(ctx, ta), "registering twice is fine")
	require.Equal(t, map[string]loadbalancer.MemberState{ta.InstanceID: loadbalancer.MemberActive, tb.InstanceID: loadbalancer.MemberActive}, members(t, p))

	url := "http://" + h.Frontends["www"] + "/"
	proctest.Eventually(t, "both servers answer through haproxy", 20*time.Second, func() bool {
		get(t, url)
		return a.hits.Load() > 0 && b.hits.Load() > 0
	})

	require.NoError(t, p.Deregister(ctx, ta))
	require.NoError(t, p.Deregister(ctx, ta), "deregistering twice is fine")
	require.Equal(t, loadbalancer.MemberDraining, members(t, p)[ta.InstanceID])
	before := a.hits.Load()
	for range 20 {
		require.Equal(t, b.addr, get(t, url), "a draining server gets no new request")
	}
	require.Equal(t, before, a.hits.Load())

	require.NoError(t, p.Register(ctx, ta), "registering a draining server makes it active again")
	require.Equal(t, loadbalancer.MemberActive, members(t, p)[ta.InstanceID])
	require.NoError(t, p.Deregister(ctx, ta))
	require.NoError(t, p.Remove(ctx, ta))
	require.NoError(t, p.Remove(ctx, ta), "removing twice is fine")
	require.NoError(t, p.Deregister(ctx, ta), "deregistering a removed server is fine")
	require.Equal(t, map[string]loadbalancer.MemberState{tb.InstanceID: loadbalancer.MemberActive}, members(t, p))
	for range 5 {
		require.Equal(t, b.addr, get(t, url))
	}
	require.NoError(t, p.Register(ctx, ta), "a removed server can come back")
	require.Equal(t, loadbalancer.MemberActive, members(t, p)[ta.InstanceID])

	// The foreign server is untouched: still there, still disabled.
	out, err := runtimeCommand(h.Socket, "show servers state www")
	require.NoError(t, err)
	require.Regexp(t, `(?m)^\d+ www \d+ static1 127\.0\.0\.1 0 5 `, out)

	require.ErrorContains(t, p.Register(ctx, loadbalancer.Target{InstanceID: "web-0000000c"}), "no address yet")
	require.ErrorContains(t, p.Register(ctx, loadbalancer.Target{InstanceID: "web-0000000c", Addresses: []string{"nope"}}), `address "nope"`)

	other, err := newProvider(t, fmt.Sprintf(`{"provider": "haproxy", "socket": %q, "backend": "api", "port": 80}`, h.Socket))
	require.NoError(t, err)
	_, err = other.Members(ctx)
	require.ErrorContains(t, err, "Can't find backend")
	require.ErrorContains(t, other.Register(ctx, ta), "No such backend")

	gone, err := newProvider(t, `{"provider": "haproxy", "socket": "/nonexistent/admin.sock", "backend": "www", "port": 80}`)
	require.NoError(t, err)
	require.ErrorContains(t, gone.Register(ctx, ta), "haproxy runtime API /nonexistent/admin.sock")
}

func runtimeCommand(socket, cmd string) (string, error) {
	c, err := net.Dial("unix", socket)
	if err != nil {
		return "", err
	}
	defer func() { _ = c.Close() }()
	if _, err := io.WriteString(c, cmd+"\n"); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	return string(b), err
}
