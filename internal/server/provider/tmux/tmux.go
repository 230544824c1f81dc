package tmux

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/localagent"
)

// DefaultSession is the session agents run in.
const DefaultSession = "nstance-dev-agents"

// WindowPrefix starts every agent window name.
const WindowPrefix = "nstance-agent-"

// ShardOption is the tmux user option (a window option) that names the
// shard whose server created the window. Shards may share a session (the
// dev stack's do): each lists, reports and deletes only windows carrying
// its own shard. A window without it (made by a version before the marker)
// is never listed, so orphan collection never deletes it; the shard that
// holds its instance record adopts it (sets the marker) on Status or Create.
const ShardOption = "@nstance-shard"

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
	// Shard is the shard whose instances this provider runs; every window
	// it creates carries it in ShardOption. Required.
	Shard string
	// HealthPort, when set, gives each agent a loopback address of its own
	// (localagent.LoopbackAddr) and NSTANCE_HEALTH_ADDR on it with this
	// port, as the process provider's HealthPort does; the instance's
	// addresses are that one first, then 127.0.0.1 (the source of its
	// connections). The dev stack's HAProxy reaches the agents this way.
	HealthPort int
	// Log receives a line for each window without a shard marker (once per
	// window) and for requests about other shards' windows.
	Log logr.Logger
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
	// unmarked are the windows without a shard marker already logged.
	unmarked map[string]bool
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
	if err := layout.ValidateID("tmux provider: shard", cfg.Shard); err != nil {
		return nil, err
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
	return &Provider{cfg: cfg, providerIDs: map[string]string{}, unmarked: map[string]bool{}}, nil
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
	id string
	// tmuxID is tmux's own window id (@N), unique in the tmux server.
	tmuxID string
	// shard is the window's ShardOption; "" when it has none.
	shard string
	dead  bool
	code  string
}

// noShard stands for an unset ShardOption in list-windows output (a shard
// id starts with a letter or digit).
const noShard = "-"

// windowsFormat: fields are separated by spaces, never tabs: under a C
// locale (no LANG, as under systemd or `env -i`) tmux prints control
// characters as '_'. Window names are WindowPrefix + a validated instance
// id and shards are validated ids: no spaces. The exit status comes last
// as it is empty while the pane runs.
const windowsFormat = "#{window_id} #{window_name} #{pane_dead} #{?#{" + ShardOption + "},#{" + ShardOption + "}," + noShard + "} #{pane_dead_status}"

// windows lists the agent windows of the session, every shard's and those
// without a marker; a missing session or server yields none. Use own or
// lookup to act on them.
func (p *Provider) windows(ctx context.Context) ([]window, error) {
	out, err := p.tmux(ctx, "list-windows", "-t", "="+p.cfg.Session, "-F", windowsFormat)
	if err != nil {
		msg := err.Error()
		// "no current target" is what tmux 3.3 says while a server whose
		// last session just closed is still shutting down.
		if strings.Contains(msg, "can't find session") || strings.Contains(msg, "no server running") ||
			strings.Contains(msg, "error connecting") || strings.Contains(msg, "No such file") ||
			strings.Contains(msg, "no current target") || strings.Contains(msg, "server exited unexpectedly") {
			return nil, nil
		}
		return nil, err
	}
	var ws []window
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		parts := strings.Fields(line)
		if len(parts) < 4 || !strings.HasPrefix(parts[1], WindowPrefix) {
			continue
		}
		w := window{tmuxID: parts[0], id: strings.TrimPrefix(parts[1], WindowPrefix), dead: parts[2] == "1"}
		if parts[3] != noShard {
			w.shard = parts[3]
		}
		if len(parts) > 4 {
			w.code = parts[4]
		}
		ws = append(ws, w)
	}
	return ws, nil
}

// own lists this shard's windows by instance id, logging (once each) the
// windows without a shard marker, which belong to no shard until adopted.
func (p *Provider) own(ctx context.Context) (map[string]window, error) {
	ws, err := p.windows(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]window{}
	present := map[string]bool{}
	for _, w := range ws {
		switch w.shard {
		case p.cfg.Shard:
			out[w.id] = w
		case "":
			present[w.tmuxID] = true
			p.pmu.Lock()
			logged := p.unmarked[w.tmuxID]
			p.unmarked[w.tmuxID] = true
			p.pmu.Unlock()
			if !logged {
				p.cfg.Log.Info("tmux window without a shard marker (made by an older version): not listed, so orphan collection never deletes it; the shard holding its instance adopts it, or kill it by hand",
					"window", WindowName(w.id), "session", p.cfg.Session, "option", ShardOption)
			}
		}
	}
	// Forget the windows that are gone (or adopted), so the set stays small.
	p.pmu.Lock()
	for id := range p.unmarked {
		if !present[id] {
			delete(p.unmarked, id)
		}
	}
	p.pmu.Unlock()
	return out, nil
}

// lookup finds the window of instance id: this shard's, or one without a
// marker, which it adopts (the caller holds a record of id, so the window
// is this shard's). Another shard's window is not found: found reports
// whether it exists at all (other holds its shard).
func (p *Provider) lookup(ctx context.Context, id string) (w window, ok bool, other string, err error) {
	ws, err := p.windows(ctx)
	if err != nil {
		return window{}, false, "", err
	}
	for _, w := range ws {
		if w.id != id {
			continue
		}
		switch w.shard {
		case p.cfg.Shard:
			return w, true, "", nil
		case "":
			if _, err := p.tmux(ctx, "set-option", "-w", "-t", w.tmuxID, ShardOption, p.cfg.Shard); err != nil {
				return window{}, false, "", fmt.Errorf("adopting window %s: %w", WindowName(id), err)
			}
			p.cfg.Log.Info("adopted a tmux window without a shard marker: this shard holds its instance", "window", WindowName(id), "shard", p.cfg.Shard)
			w.shard = p.cfg.Shard
			return w, true, "", nil
		default:
			other = w.shard
		}
	}
	return window{}, false, other, nil
}

// addresses are an instance's addresses: its own loopback address first
// under HealthPort.
func (p *Provider) addresses(id string) []string {
	if p.cfg.HealthPort > 0 {
		return []string{localagent.LoopbackAddr(id), "127.0.0.1"}
	}
	return []string{"127.0.0.1"}
}

func (p *Provider) instance(ctx context.Context, w window) provider.Instance {
	inst := provider.Instance{InstanceID: w.id, ProviderID: p.providerID(ctx, w.id), State: provider.StateRunning, Addresses: p.addresses(w.id)}
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
	w, ok, other, err := p.lookup(ctx, req.InstanceID)
	if err != nil {
		return provider.Instance{}, fmt.Errorf("tmux create %s: %w", req.InstanceID, err)
	}
	if ok {
		return p.instance(ctx, w), nil
	}
	if other != "" {
		return provider.Instance{}, fmt.Errorf("tmux create %s: window %s in session %s belongs to shard %s", req.InstanceID, WindowName(req.InstanceID), p.cfg.Session, other)
	}
	if _, err := localagent.Prepare(p.cfg.StateDir, req); err != nil {
		return provider.Instance{}, fmt.Errorf("tmux create %s: %w", req.InstanceID, err)
	}
	name := WindowName(req.InstanceID)
	var opts []string
	if p.cfg.WorkDir != "" {
		opts = append(opts, "-c", p.cfg.WorkDir)
	}
	env := append(append([]string{}, p.cfg.Env...), localagent.Env(p.cfg.StateDir, req)...)
	if p.cfg.HealthPort > 0 {
		env = append(env, localagent.EnvHealthAddr+"="+net.JoinHostPort(localagent.LoopbackAddr(req.InstanceID), strconv.Itoa(p.cfg.HealthPort)))
	}
	for _, kv := range env {
		opts = append(opts, "-e", kv)
	}
	// remain-on-exit is switched on in the same tmux command list that makes
	// the window (tmux runs a list before it handles the child's exit), so
	// an agent that exits at once still shows as a dead pane (stopped)
	// rather than as no window (gone).
	opts = append(opts, p.cfg.Command)
	target := "=" + p.cfg.Session + ":=" + name
	// The shard marker is set in the same tmux command list as the window
	// is made, so no other client sees the window without it.
	mark := []string{";", "set-option", "-w", "-t", target, ShardOption, p.cfg.Shard, ";", "set-option", "-w", "-t", target, "remain-on-exit", "on"}
	newWindow := append(append([]string{"new-window", "-d", "-t", "=" + p.cfg.Session + ":", "-n", name}, opts...), mark...)
	if p.sessionExists(ctx) {
		_, err = p.tmux(ctx, newWindow...)
	} else {
		_, err = p.tmux(ctx, append(append([]string{"new-session", "-d", "-s", p.cfg.Session, "-n", name, "-x", "200", "-y", "50"}, opts...), mark...)...)
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
	_, _ = p.tmux(ctx, "set-environment", "-t", "="+p.cfg.Session, localagent.EnvProviderID+"_"+strings.ReplaceAll(req.InstanceID, "-", "_"), req.ProviderID)
	p.pmu.Lock()
	p.providerIDs[req.InstanceID] = req.ProviderID
	p.pmu.Unlock()
	if err := localagent.WriteNode(p.cfg.NodeDir, req, time.Now()); err != nil {
		_, _ = p.tmux(ctx, "kill-window", "-t", target)
		_ = localagent.Cleanup(p.cfg.StateDir, req.InstanceID)
		return provider.Instance{}, fmt.Errorf("tmux create %s: %w", req.InstanceID, err)
	}
	return provider.Instance{InstanceID: req.InstanceID, ProviderID: req.ProviderID, State: provider.StateRunning, Addresses: p.addresses(req.InstanceID)}, nil
}

func (p *Provider) sessionExists(ctx context.Context) bool {
	_, err := p.tmux(ctx, "has-session", "-t", "="+p.cfg.Session)
	return err == nil
}

// Status implements provider.Provider.
func (p *Provider) Status(ctx context.Context, id string) (provider.Instance, error) {
	w, ok, _, err := p.lookup(ctx, id)
	if err != nil {
		return provider.Instance{}, fmt.Errorf("tmux status %s: %w", id, err)
	}
	if !ok {
		return provider.Instance{}, fmt.Errorf("tmux status %s: %w", id, provider.ErrNotFound)
	}
	return p.instance(ctx, w), nil
}

// List implements provider.Provider: this shard's windows only.
func (p *Provider) List(ctx context.Context) ([]provider.Instance, error) {
	ws, err := p.own(ctx)
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
// Another shard's window of that id is left alone, and so are its files.
func (p *Provider) Delete(ctx context.Context, id string) error {
	if err := provider.ValidateInstanceID(id); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	w, ok, other, err := p.lookup(ctx, id)
	if err != nil {
		return fmt.Errorf("tmux delete %s: %w", id, err)
	}
	if other != "" {
		p.cfg.Log.Info("not deleting another shard's tmux window", "window", WindowName(id), "owner", other, "shard", p.cfg.Shard)
		return nil
	}
	if ok {
		if _, err := p.tmux(ctx, "kill-window", "-t", w.tmuxID); err != nil {
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
