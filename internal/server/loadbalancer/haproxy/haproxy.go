// Package haproxy is the haproxy load balancer kind: a running HAProxy (2.4
// or later) driven through its runtime API socket. Members of a group become
// dynamic servers of one backend ("add server", then "set server ... state
// ready"); deregistration puts a server in drain (no new connections), Remove
// puts it in maintenance, shuts its sessions and deletes it. Servers this
// shard added are named server_prefix + instance id; every other server of the
// backend is foreign and never touched.
package haproxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
)

// Name is the kind's name (load_balancers.<name>.provider).
const Name = "haproxy"

// Defaults.
const (
	DefaultDrainDelay    = 30 * time.Second
	DefaultTimeout       = 5 * time.Second
	DefaultServerOptions = "check"
)

// Kind returns the haproxy kind for a loadbalancer.Registry.
func Kind() loadbalancer.Kind {
	return loadbalancer.Kind{Name: Name, Config: func() loadbalancer.KindConfig {
		return &Settings{
			DrainDelay:    config.Duration(DefaultDrainDelay),
			Timeout:       config.Duration(DefaultTimeout),
			ServerOptions: DefaultServerOptions,
		}
	}}
}

// Settings are the keys of one haproxy entry besides "provider".
type Settings struct {
	// Socket is the runtime API address: a Unix socket path (absolute) or
	// host:port of a TCP "stats socket" with level admin.
	Socket string `json:"socket"`
	// Backend is the HAProxy backend the members are added to.
	Backend string `json:"backend"`
	// Port is the port on the instances the servers forward to.
	Port int `json:"port"`
	// ServerOptions are the server keywords every added server gets
	// (default "check": HAProxy's own TCP health check, which dynamic
	// servers do not take from default-server).
	ServerOptions string `json:"server_options"`
	// ServerPrefix begins the name of every server this shard adds
	// (default "nstance-{shard}-"); servers without it are foreign.
	ServerPrefix string `json:"server_prefix"`
	// DrainDelay is how long a deregistered server keeps its connections
	// before it is deleted (default 30s).
	DrainDelay config.Duration `json:"drain_delay"`
	// Timeout bounds one runtime API command (default 5s).
	Timeout config.Duration `json:"timeout"`
}

var (
	serverName = regexp.MustCompile(`^[A-Za-z0-9_.:-]*$`)
	// Options are passed on one runtime API line: no command separator,
	// no line break.
	badOptionChars = "\n\r;#"
)

// Validate checks the settings; key is the entry's path.
func (s *Settings) Validate(cfg *config.Config, key string) config.Errors {
	var errs config.Errors
	add := func(k, format string, args ...any) {
		errs = append(errs, config.FieldError{Key: key + "." + k, Reason: fmt.Sprintf(format, args...)})
	}
	switch {
	case s.Socket == "":
		add("socket", "required: the runtime API socket path or host:port")
	case strings.HasPrefix(s.Socket, "/"):
	default:
		if _, _, err := net.SplitHostPort(s.Socket); err != nil {
			add("socket", "want an absolute Unix socket path or host:port, got %q", s.Socket)
		}
	}
	if s.Backend == "" {
		add("backend", "required")
	} else if !serverName.MatchString(s.Backend) {
		add("backend", "invalid backend name %q", s.Backend)
	}
	if s.Port < 1 || s.Port > 65535 {
		add("port", "want a port between 1 and 65535, got %d", s.Port)
	}
	if strings.ContainsAny(s.ServerOptions, badOptionChars) {
		add("server_options", "must not contain a line break, ';' or '#'")
	}
	if !serverName.MatchString(s.prefix(cfg)) {
		add("server_prefix", "may hold only letters, digits and _.:- , got %q", s.prefix(cfg))
	}
	if s.DrainDelay < 0 {
		add("drain_delay", "must not be negative, got %s", s.DrainDelay.D())
	}
	if s.Timeout <= 0 {
		add("timeout", "must be positive, got %s", s.Timeout.D())
	}
	return errs
}

func (s *Settings) prefix(cfg *config.Config) string {
	if s.ServerPrefix != "" {
		return s.ServerPrefix
	}
	return "nstance-" + cfg.Shard.ID + "-"
}

// New builds the entry's provider; it does not dial the socket.
func (s *Settings) New(_ context.Context, env loadbalancer.Env) (loadbalancer.Provider, error) {
	return &Provider{s: *s, prefix: s.prefix(env.Config())}, nil
}

// Provider drives one HAProxy backend.
type Provider struct {
	s      Settings
	prefix string
}

var _ loadbalancer.Provider = (*Provider)(nil)

// ServerName is the name of the server of instance id.
func (p *Provider) ServerName(instanceID string) string { return p.prefix + instanceID }

func (p *Provider) server(t loadbalancer.Target) string {
	return p.s.Backend + "/" + p.ServerName(t.InstanceID)
}

// Register adds the target's server (or updates its address) and makes it
// ready.
func (p *Provider) Register(ctx context.Context, t loadbalancer.Target) error {
	if len(t.Addresses) == 0 {
		return fmt.Errorf("register %s with haproxy backend %s: the instance has no address yet", t.InstanceID, p.s.Backend)
	}
	ip, err := netip.ParseAddr(t.Addresses[0])
	if err != nil {
		return fmt.Errorf("register %s with haproxy backend %s: address %q: %w", t.InstanceID, p.s.Backend, t.Addresses[0], err)
	}
	addr := net.JoinHostPort(ip.String(), strconv.Itoa(p.s.Port))
	srv := p.server(t)
	out, err := p.command(ctx, strings.TrimSpace("add server "+srv+" "+addr+" "+p.s.ServerOptions))
	if err != nil {
		return fmt.Errorf("register %s: %w", t.InstanceID, err)
	}
	switch {
	case strings.Contains(out, "New server registered"):
		if p.checks() {
			if err := p.expectEmpty(ctx, "enable health "+srv); err != nil {
				return fmt.Errorf("register %s: %w", t.InstanceID, err)
			}
		}
	case strings.Contains(out, "Already exists"):
		// Registered before (a retry, or a new leader): keep its address current.
		if err := p.expectEmpty(ctx, fmt.Sprintf("set server %s addr %s port %d", srv, ip, p.s.Port)); err != nil &&
			!strings.Contains(err.Error(), "no need to change") {
			return fmt.Errorf("register %s: %w", t.InstanceID, err)
		}
	default:
		return fmt.Errorf("register %s: haproxy: add server %s: %s", t.InstanceID, srv, strings.TrimSpace(out))
	}
	if err := p.expectEmpty(ctx, "set server "+srv+" state ready"); err != nil {
		return fmt.Errorf("register %s: %w", t.InstanceID, err)
	}
	return nil
}

func (p *Provider) checks() bool {
	for _, f := range strings.Fields(p.s.ServerOptions) {
		if f == "check" {
			return true
		}
	}
	return false
}

// Deregister puts the target's server in drain: it gets no new connection.
func (p *Provider) Deregister(ctx context.Context, t loadbalancer.Target) error {
	err := p.expectEmpty(ctx, "set server "+p.server(t)+" state drain")
	if errors.Is(err, loadbalancer.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("deregister %s: %w", t.InstanceID, err)
	}
	return nil
}

// Remove puts the target's server in maintenance, shuts its sessions and
// deletes it.
func (p *Provider) Remove(ctx context.Context, t loadbalancer.Target) error {
	srv := p.server(t)
	for _, cmd := range []string{"set server " + srv + " state maint", "shutdown sessions server " + srv} {
		err := p.expectEmpty(ctx, cmd)
		if errors.Is(err, loadbalancer.ErrNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("remove %s: %w", t.InstanceID, err)
		}
	}
	out, err := p.command(ctx, "del server "+srv)
	if err != nil {
		return fmt.Errorf("remove %s: %w", t.InstanceID, err)
	}
	if !strings.Contains(out, "Server deleted") && !strings.Contains(out, "No such server") {
		return fmt.Errorf("remove %s: haproxy: del server %s: %s", t.InstanceID, srv, strings.TrimSpace(out))
	}
	return nil
}

// Admin state bits of "show servers state" (srv_admin_state).
const (
	adminForcedMaint   = 0x01
	adminInheritMaint  = 0x02
	adminConfigMaint   = 0x04
	adminForcedDrain   = 0x08
	adminInheritDrain  = 0x10
	adminResolverMaint = 0x20
	adminHostnameMaint = 0x40
)

var opStates = map[string]string{"0": "down", "1": "starting", "2": "up", "3": "stopping"}

// Members lists this shard's servers of the backend from "show servers
// state".
func (p *Provider) Members(ctx context.Context) ([]loadbalancer.Member, error) {
	out, err := p.command(ctx, "show servers state "+p.s.Backend)
	if err != nil {
		return nil, fmt.Errorf("list members: %w", err)
	}
	return ParseServersState(out, p.s.Backend, p.prefix)
}

// ParseServersState reads the output of "show servers state <backend>" and
// returns the servers of backend whose names begin with prefix, as members
// named by the rest of their names.
func ParseServersState(out, backend, prefix string) ([]loadbalancer.Member, error) {
	sc := bufio.NewScanner(strings.NewReader(out))
	var cols map[string]int
	var members []loadbalancer.Member
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line == "1" && cols == nil:
			continue
		case strings.HasPrefix(line, "# "):
			cols = map[string]int{}
			for i, c := range strings.Fields(strings.TrimPrefix(line, "# ")) {
				cols[c] = i
			}
			continue
		case cols == nil:
			return nil, fmt.Errorf("haproxy: show servers state %s: %s", backend, line)
		}
		f := strings.Fields(line)
		get := func(c string) string {
			i, ok := cols[c]
			if !ok || i >= len(f) {
				return ""
			}
			return f[i]
		}
		name := get("srv_name")
		if get("be_name") != backend || !strings.HasPrefix(name, prefix) || name == prefix {
			continue
		}
		admin, err := strconv.Atoi(get("srv_admin_state"))
		if err != nil {
			return nil, fmt.Errorf("haproxy: show servers state %s: server %s: admin state %q", backend, name, get("srv_admin_state"))
		}
		m := loadbalancer.Member{InstanceID: strings.TrimPrefix(name, prefix), State: loadbalancer.MemberActive,
			Detail: opStates[get("srv_op_state")]}
		switch {
		case admin&(adminForcedMaint|adminInheritMaint|adminConfigMaint|adminResolverMaint|adminHostnameMaint) != 0:
			m.State = loadbalancer.MemberInactive
		case admin&(adminForcedDrain|adminInheritDrain) != 0:
			m.State = loadbalancer.MemberDraining
		}
		members = append(members, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("haproxy: show servers state %s: %w", backend, err)
	}
	if cols == nil {
		return nil, fmt.Errorf("haproxy: show servers state %s: no header in %q", backend, strings.TrimSpace(out))
	}
	return members, nil
}

// DeregistrationDelay is the entry's drain_delay.
func (p *Provider) DeregistrationDelay(context.Context) (time.Duration, error) {
	return p.s.DrainDelay.D(), nil
}

// expectEmpty runs a command whose success answer is empty. "No such
// server." is loadbalancer.ErrNotFound (wrapped).
func (p *Provider) expectEmpty(ctx context.Context, cmd string) error {
	out, err := p.command(ctx, cmd)
	if err != nil {
		return err
	}
	out = strings.TrimSpace(out)
	switch {
	case out == "":
		return nil
	case strings.Contains(out, "No such server"):
		return fmt.Errorf("haproxy: %s: %w", cmd, loadbalancer.ErrNotFound)
	default:
		return fmt.Errorf("haproxy: %s: %s", cmd, out)
	}
}

// command sends one line to the runtime API and returns the whole answer
// (the socket closes after it in non-interactive mode).
func (p *Provider) command(ctx context.Context, cmd string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, p.s.Timeout.D())
	defer cancel()
	network := "tcp"
	if strings.HasPrefix(p.s.Socket, "/") {
		network = "unix"
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, p.s.Socket)
	if err != nil {
		return "", fmt.Errorf("haproxy runtime API %s: %w", p.s.Socket, err)
	}
	defer func() { _ = conn.Close() }()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := io.WriteString(conn, cmd+"\n"); err != nil {
		return "", fmt.Errorf("haproxy runtime API %s: %s: %w", p.s.Socket, cmd, err)
	}
	b, err := io.ReadAll(conn)
	if err != nil {
		return "", fmt.Errorf("haproxy runtime API %s: %s: %w", p.s.Socket, cmd, err)
	}
	return string(b), nil
}
