package tmux

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/localagent"
)

// DefaultSession is the session agents run in.
const DefaultSession = "nstance-dev-agents"

// WindowPrefix starts every agent window name.
const WindowPrefix = "nstance-agent-"

// Config configures the tmux provider.
type Config struct {
	// Command is the shell command each window runs. Required.
	Command string
	// Session is the tmux session name (default DefaultSession).
	Session string
	// Socket, when set, is passed as `tmux -L socket` to use a private tmux server.
	Socket string
	// StateDir holds one directory per instance. Required.
	StateDir string
	// NodeDir, when set, receives a fake Node JSON per instance.
	NodeDir string
	// WorkDir is the windows' start directory; empty means the server's.
	WorkDir string
	// Env is added to each window's environment (KEY=VALUE).
	Env []string
	// Binary is the tmux executable (default "tmux").
	Binary string
}

// Provider manages agent windows in one tmux session.
type Provider struct {
	cfg Config
	// mu serialises tmux mutations so two creates do not both start the session.
	mu sync.Mutex
	// providerIDs remembers what each created window was given; after a
	// restart it is read back from the window's environment.
	pmu         sync.Mutex
	providerIDs map[string]string
}

var _ provider.Provider = (*Provider)(nil)

// New checks the configuration and returns a provider.
func New(cfg Config) (*Provider, error) {
	if strings.TrimSpace(cfg.Command) == "" {
		return nil, errors.New("tmux provider: command is required")
	}
	if cfg.StateDir == "" {
		return nil, errors.New("tmux provider: state dir is required")
	}
	if cfg.Session == "" {
		cfg.Session = DefaultSession
	}
	if strings.ContainsAny(cfg.Session, ":.=") {
		return nil, fmt.Errorf("tmux provider: session name %q must not contain ':', '.' or '='", cfg.Session)
	}
	if cfg.Binary == "" {
		cfg.Binary = "tmux"
	}
	if _, err := exec.LookPath(cfg.Binary); err != nil {
		return nil, fmt.Errorf("tmux provider: %w", err)
	}
	return &Provider{cfg: cfg, providerIDs: map[string]string{}}, nil
}

// Session returns the session name in use.
func (p *Provider) Session() string { return p.cfg.Session }

// WindowName is the window of an instance.
func WindowName(instanceID string) string { return WindowPrefix + instanceID }

func (p *Provider) tmux(ctx context.Context, args ...string) (string, error) {
	full := args
	if p.cfg.Socket != "" {
		full = append([]string{"-L", p.cfg.Socket}, args...)
	}
	cmd := exec.CommandContext(ctx, p.cfg.Binary, full...)
	env := os.Environ()
	filtered := env[:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "TMUX=") {
			filtered = append(filtered, kv)
		}
	}
	cmd.Env = filtered
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("tmux %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

type window struct {
	id   string
	dead bool
	code string
}

// windows lists the agent windows of the session; a missing session or
// server yields none.
func (p *Provider) windows(ctx context.Context) (map[string]window, error) {
	// Fields are separated by spaces, never tabs: under a C locale (no LANG,
	// as under systemd or `env -i`) tmux prints control characters as '_'.
	// Window names are WindowPrefix + a validated instance id: no spaces.
	out, err := p.tmux(ctx, "list-windows", "-t", "="+p.cfg.Session, "-F", "#{window_name} #{pane_dead} #{pane_dead_status}")
	if err != nil {
		msg := err.Error()
		// "no current target" is what tmux 3.3 says while a server whose
		// last session just closed is still shutting down.
		if strings.Contains(msg, "can't find session") || strings.Contains(msg, "no server running") ||
			strings.Contains(msg, "error connecting") || strings.Contains(msg, "No such file") ||
			strings.Contains(msg, "no current target") || strings.Contains(msg, "server exited unexpectedly") {
			return map[string]window{}, nil
		}
		return nil, err
	}
	ws := map[string]window{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		parts := strings.Fields(line)
		if len(parts) < 2 || !strings.HasPrefix(parts[0], WindowPrefix) {
			continue
		}
		id := strings.TrimPrefix(parts[0], WindowPrefix)
		w := window{id: id, dead: parts[1] == "1"}
		if len(parts) > 2 {
			w.code = parts[2]
		}
		ws[id] = w
	}
	return ws, nil
}

func (p *Provider) instance(ctx context.Context, w window) provider.Instance {
	inst := provider.Instance{InstanceID: w.id, ProviderID: p.providerID(ctx, w.id), State: provider.StateRunning, Addresses: []string{"127.0.0.1"}}
	if w.dead {
		inst.State = provider.StateStopped
		inst.Message = "agent command exited"
		if w.code != "" {
			inst.Message += " with status " + w.code
		}
	}
	return inst
}

func (p *Provider) providerID(ctx context.Context, id string) string {
	p.pmu.Lock()
	pid, ok := p.providerIDs[id]
	p.pmu.Unlock()
	if ok {
		return pid
	}
	out, err := p.tmux(ctx, "show-environment", "-t", "="+p.cfg.Session, localagent.EnvProviderID+"_"+strings.ReplaceAll(id, "-", "_"))
	if err == nil {
		if _, v, ok := strings.Cut(strings.TrimSpace(out), "="); ok {
			p.pmu.Lock()
			p.providerIDs[id] = v
			p.pmu.Unlock()
			return v
		}
	}
	return ""
}

// Create implements provider.Provider.
func (p *Provider) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	if err := provider.ValidateInstanceID(req.InstanceID); err != nil {
		return provider.Instance{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	ws, err := p.windows(ctx)
	if err != nil {
		return provider.Instance{}, fmt.Errorf("tmux create %s: %w", req.InstanceID, err)
	}
	if w, ok := ws[req.InstanceID]; ok {
		return p.instance(ctx, w), nil
	}
	if _, err := localagent.Prepare(p.cfg.StateDir, req); err != nil {
		return provider.Instance{}, fmt.Errorf("tmux create %s: %w", req.InstanceID, err)
	}
	name := WindowName(req.InstanceID)
	var opts []string
	if p.cfg.WorkDir != "" {
		opts = append(opts, "-c", p.cfg.WorkDir)
	}
	for _, kv := range append(append([]string{}, p.cfg.Env...), localagent.Env(p.cfg.StateDir, req)...) {
		opts = append(opts, "-e", kv)
	}
	// remain-on-exit is switched on right after creation so an exited agent
	// shows as a dead pane (stopped); one that exits before that leaves no
	// window, which reads as gone. Both lead to a replacement.
	opts = append(opts, p.cfg.Command)
	newWindow := append([]string{"new-window", "-d", "-t", "=" + p.cfg.Session + ":", "-n", name}, opts...)
	if p.sessionExists(ctx) {
		_, err = p.tmux(ctx, newWindow...)
	} else {
		_, err = p.tmux(ctx, append([]string{"new-session", "-d", "-s", p.cfg.Session, "-n", name, "-x", "200", "-y", "50"}, opts...)...)
		if err != nil && p.sessionExists(ctx) {
			// Another server sharing the tmux server (the dev stack's
			// shards do) created the session in between: add a window.
			_, err = p.tmux(ctx, newWindow...)
		}
	}
	if err != nil {
		_ = localagent.Cleanup(p.cfg.StateDir, req.InstanceID)
		return provider.Instance{}, fmt.Errorf("tmux create %s: %w", req.InstanceID, err)
	}
	target := "=" + p.cfg.Session + ":=" + name
	_, _ = p.tmux(ctx, "set-option", "-w", "-t", target, "remain-on-exit", "on")
	_, _ = p.tmux(ctx, "set-environment", "-t", "="+p.cfg.Session, localagent.EnvProviderID+"_"+strings.ReplaceAll(req.InstanceID, "-", "_"), req.ProviderID)
	p.pmu.Lock()
	p.providerIDs[req.InstanceID] = req.ProviderID
	p.pmu.Unlock()
	if err := localagent.WriteNode(p.cfg.NodeDir, req, time.Now()); err != nil {
		_, _ = p.tmux(ctx, "kill-window", "-t", target)
		_ = localagent.Cleanup(p.cfg.StateDir, req.InstanceID)
		return provider.Instance{}, fmt.Errorf("tmux create %s: %w", req.InstanceID, err)
	}
	return provider.Instance{InstanceID: req.InstanceID, ProviderID: req.ProviderID, State: provider.StateRunning, Addresses: []string{"127.0.0.1"}}, nil
}

func (p *Provider) sessionExists(ctx context.Context) bool {
	_, err := p.tmux(ctx, "has-session", "-t", "="+p.cfg.Session)
	return err == nil
}

// Status implements provider.Provider.
func (p *Provider) Status(ctx context.Context, id string) (provider.Instance, error) {
	ws, err := p.windows(ctx)
	if err != nil {
		return provider.Instance{}, fmt.Errorf("tmux status %s: %w", id, err)
	}
	w, ok := ws[id]
	if !ok {
		return provider.Instance{}, fmt.Errorf("tmux status %s: %w", id, provider.ErrNotFound)
	}
	return p.instance(ctx, w), nil
}

// List implements provider.Provider.
func (p *Provider) List(ctx context.Context) ([]provider.Instance, error) {
	ws, err := p.windows(ctx)
	if err != nil {
		return nil, fmt.Errorf("tmux list: %w", err)
	}
	out := make([]provider.Instance, 0, len(ws))
	for _, w := range ws {
		out = append(out, p.instance(ctx, w))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].InstanceID < out[j].InstanceID })
	return out, nil
}

// Delete implements provider.Provider: the window is killed (tmux sends
// SIGHUP to its processes), then the Node file and identity directory go.
func (p *Provider) Delete(ctx context.Context, id string) error {
	if err := provider.ValidateInstanceID(id); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	ws, err := p.windows(ctx)
	if err != nil {
		return fmt.Errorf("tmux delete %s: %w", id, err)
	}
	if _, ok := ws[id]; ok {
		if _, err := p.tmux(ctx, "kill-window", "-t", "="+p.cfg.Session+":="+WindowName(id)); err != nil {
			return fmt.Errorf("tmux delete %s: %w", id, err)
		}
	}
	if p.sessionExists(ctx) {
		_, _ = p.tmux(ctx, "set-environment", "-u", "-t", "="+p.cfg.Session, localagent.EnvProviderID+"_"+strings.ReplaceAll(id, "-", "_"))
	}
	p.pmu.Lock()
	delete(p.providerIDs, id)
	p.pmu.Unlock()
	if err := localagent.RemoveNode(p.cfg.NodeDir, id); err != nil {
		return fmt.Errorf("tmux delete %s: %w", id, err)
	}
	if err := localagent.Cleanup(p.cfg.StateDir, id); err != nil {
		return fmt.Errorf("tmux delete %s: %w", id, err)
	}
	return nil
}

// Socket returns the private tmux socket name, empty for the default server.
func (p *Provider) Socket() string { return p.cfg.Socket }

// SocketPath is where tmux keeps the socket of a server started with
// `-L name`. tmux leaves the file behind when such a server is killed, so
// whoever created a private server removes it.
func SocketPath(name string) string {
	dir := os.Getenv("TMUX_TMPDIR")
	if dir == "" {
		dir = "/tmp" // tmux ignores TMPDIR
	}
	return filepath.Join(dir, fmt.Sprintf("tmux-%d", os.Getuid()), name)
}
