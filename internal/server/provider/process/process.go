package process

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/localagent"
)

// Config configures the process provider.
type Config struct {
	// Command is the agent argv, e.g. ["bin/nstance-agent"]. Required.
	Command []string
	// StateDir holds one directory per instance. Required.
	StateDir string
	// NodeDir, when set, receives a fake Node JSON per instance.
	NodeDir string
	// WorkDir is the children's working directory; empty means the server's.
	WorkDir string
	// Env is added to the children's environment (KEY=VALUE).
	Env []string
	// StopTimeout is how long a child gets after SIGTERM before SIGKILL (default 5s).
	StopTimeout time.Duration
	// HealthPort, when set, gives each agent a loopback address of its own
	// (LoopbackAddr) and NSTANCE_HEALTH_ADDR on it with this port; the
	// instance's addresses are that one first, then 127.0.0.1 (the source
	// of its connections). Load balancer tests put the agents behind one
	// backend port this way.
	HealthPort int
	// Nice, 1 to 19, lowers the CPU priority of each child's process group
	// by that much below the server's own (setpriority right after start,
	// capped at 19; whatever it runs inherits it). The
	// children are simulated VMs sharing the machine with the server whose
	// decisions they wait for: a hundred agents booting at once must not
	// delay the creates of the next hundred. 0 leaves the priority alone.
	Nice int
}

// LoopbackAddr is the loopback address of instance id under HealthPort
// (localagent.LoopbackAddr, shared with the tmux provider).
func LoopbackAddr(id string) string { return localagent.LoopbackAddr(id) }

type child struct {
	pid        int
	startTicks uint64
	providerID string
	// own: started by this provider, so ours to reap (wait4 without
	// blocking, when its liveness is checked); adopted processes are not
	// our children and are polled through /proc instead.
	own bool
	// exited is set once the child has been reaped, with how it ended.
	exited bool
	status syscall.WaitStatus
}

type record struct {
	PID        int    `json:"pid"`
	StartTicks uint64 `json:"start_ticks"`
	ProviderID string `json:"provider_id"`
}

// Provider runs agents as child processes.
type Provider struct {
	cfg      Config
	mu       sync.Mutex
	children map[string]*child
	// creating holds the instances whose Create runs, closed when it ends:
	// a Create starts the process outside mu (so a hundred creates, and the
	// Status calls beside them, do not queue behind one another), and a
	// second Create or a Delete of the same instance waits for it.
	creating map[string]chan struct{}
	// childNice is the niceness children get (Config.Nice above the
	// server's own).
	childNice int
}

var _ provider.Provider = (*Provider)(nil)

// New returns a provider and re-adopts the live processes recorded in StateDir.
func New(cfg Config) (*Provider, error) {
	if len(cfg.Command) == 0 {
		return nil, errors.New("process provider: command is required")
	}
	if cfg.StateDir == "" {
		return nil, errors.New("process provider: state dir is required")
	}
	if cfg.Nice < 0 || cfg.Nice > 19 {
		return nil, fmt.Errorf("process provider: nice %d is not within 0-19", cfg.Nice)
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = 5 * time.Second
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("process provider: %w", err)
	}
	p := &Provider{cfg: cfg, children: map[string]*child{}, creating: map[string]chan struct{}{}}
	if cfg.Nice > 0 {
		// The raw getpriority system call answers 20 - nice.
		raw, err := syscall.Getpriority(syscall.PRIO_PROCESS, 0)
		if err != nil {
			return nil, fmt.Errorf("process provider: reading the server's nice value: %w", err)
		}
		p.childNice = min(20-raw+cfg.Nice, 19)
	}
	if err := p.adopt(); err != nil {
		return nil, err
	}
	return p, nil
}

// adopt records every process recorded in StateDir that this Provider does
// not know yet: another server of the shard (an earlier leader) may have
// created instances since this one started. List looks again each time;
// the per-instance calls look only for the instance they are about
// (adoptOne), so they do no directory scan. Callers hold p.mu (or own p
// exclusively).
func (p *Provider) adopt() error {
	entries, err := os.ReadDir(p.cfg.StateDir)
	if err != nil {
		return fmt.Errorf("process provider: reading state dir: %w", err)
	}
	for _, e := range entries {
		if e.IsDir() {
			p.adoptOne(e.Name())
		}
	}
	return nil
}

// adoptOne records the process of instance id from its process.json when
// this Provider does not know it yet; callers hold p.mu.
func (p *Provider) adoptOne(id string) {
	if _, known := p.children[id]; known || provider.ValidateInstanceID(id) != nil {
		return
	}
	b, err := os.ReadFile(filepath.Join(p.cfg.StateDir, id, "process.json"))
	if err != nil {
		return
	}
	var r record
	if json.Unmarshal(b, &r) != nil || r.PID <= 0 {
		return
	}
	p.children[id] = &child{pid: r.PID, startTicks: r.StartTicks, providerID: r.ProviderID}
}

// Create implements provider.Provider.
func (p *Provider) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	if err := provider.ValidateInstanceID(req.InstanceID); err != nil {
		return provider.Instance{}, err
	}
	p.mu.Lock()
	for {
		p.adoptOne(req.InstanceID)
		if c, ok := p.children[req.InstanceID]; ok {
			inst := p.observe(req.InstanceID, c)
			p.mu.Unlock()
			return inst, nil
		}
		busy, ok := p.creating[req.InstanceID]
		if !ok {
			break
		}
		// Another Create of this instance runs: its outcome is ours.
		p.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return provider.Instance{}, fmt.Errorf("process create %s: %w", req.InstanceID, ctx.Err())
		}
		p.mu.Lock()
	}
	done := make(chan struct{})
	p.creating[req.InstanceID] = done
	p.mu.Unlock()
	c, err := p.start(req)
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.creating, req.InstanceID)
	close(done)
	if err != nil {
		return provider.Instance{}, err
	}
	p.children[req.InstanceID] = c
	return p.observe(req.InstanceID, c), nil
}

// waitCreate waits until no Create of id runs; callers hold p.mu, which
// is released while waiting.
func (p *Provider) waitCreate(id string) {
	for {
		busy, ok := p.creating[id]
		if !ok {
			return
		}
		p.mu.Unlock()
		<-busy
		p.mu.Lock()
	}
}

// start starts the agent of req (or adopts one an earlier Create started)
// and records it on disk; the caller marked the instance as creating.
func (p *Provider) start(req provider.CreateRequest) (*child, error) {
	dir := localagent.InstanceDir(p.cfg.StateDir, req.InstanceID)
	if _, err := os.Stat(dir); err == nil {
		// An earlier Create (this or another server, killed before it
		// recorded the PID) may have started the process already: adopt it
		// instead of starting a second one.
		if c, ok := p.findUnrecorded(req); ok {
			if err := p.record(dir, c); err != nil {
				return nil, fmt.Errorf("process create %s: recording adopted pid: %w", req.InstanceID, err)
			}
			return c, nil
		}
	}
	if _, err := localagent.Prepare(p.cfg.StateDir, req); err != nil {
		return nil, fmt.Errorf("process create %s: %w", req.InstanceID, err)
	}
	logf, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("process create %s: %w", req.InstanceID, err)
	}
	cmd := exec.Command(p.cfg.Command[0], p.cfg.Command[1:]...)
	cmd.Dir = p.cfg.WorkDir
	cmd.Env = append(append(os.Environ(), p.cfg.Env...), localagent.Env(p.cfg.StateDir, req)...)
	if p.cfg.HealthPort > 0 {
		cmd.Env = append(cmd.Env, localagent.EnvHealthAddr+"="+net.JoinHostPort(LoopbackAddr(req.InstanceID), strconv.Itoa(p.cfg.HealthPort)))
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		_ = localagent.Cleanup(p.cfg.StateDir, req.InstanceID)
		return nil, fmt.Errorf("process create %s: starting %q: %w", req.InstanceID, p.cfg.Command[0], err)
	}
	// The child holds its own copy of the log file; and it is reaped by
	// alive with a non-blocking wait4, not by cmd.Wait, which would keep a
	// pidfd and a thread blocked in waitid per instance (a shard of 10,000
	// instances then exhausts the server's descriptors and threads).
	logf.Close()
	c := &child{pid: cmd.Process.Pid, providerID: req.ProviderID, own: true}
	if p.cfg.Nice > 0 {
		// The group is the child's own (Setpgid): the shell or agent it
		// is, and anything it started in the meantime.
		if err := syscall.Setpriority(syscall.PRIO_PGRP, c.pid, p.childNice); err != nil {
			killGroup(c.pid, syscall.SIGKILL)
			return nil, fmt.Errorf("process create %s: setting nice %d: %w", req.InstanceID, p.childNice, err)
		}
	}
	c.startTicks, _, _ = procStat(c.pid)
	if err := cmd.Process.Release(); err != nil {
		killGroup(c.pid, syscall.SIGKILL)
		return nil, fmt.Errorf("process create %s: releasing the process handle: %w", req.InstanceID, err)
	}
	if err := p.record(dir, c); err != nil {
		killGroup(c.pid, syscall.SIGKILL)
		return nil, fmt.Errorf("process create %s: recording pid: %w", req.InstanceID, err)
	}
	if err := localagent.WriteNode(p.cfg.NodeDir, req, time.Now()); err != nil {
		killGroup(c.pid, syscall.SIGKILL)
		return nil, fmt.Errorf("process create %s: %w", req.InstanceID, err)
	}
	return c, nil
}

// record writes the child's PID and start time into dir/process.json
// atomically (a crash leaves the old file or the new one, never half).
func (p *Provider) record(dir string, c *child) error {
	b, err := json.Marshal(record{PID: c.pid, StartTicks: c.startTicks, ProviderID: c.providerID})
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, ".process.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "process.json"))
}

// findUnrecorded looks for a live process started for req whose PID was
// never recorded: its environment names this instance's identity
// directory (unique per state dir and instance).
func (p *Provider) findUnrecorded(req provider.CreateRequest) (*child, bool) {
	want := localagent.EnvIdentityDir + "=" + localagent.IdentityDir(p.cfg.StateDir, req.InstanceID)
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, false
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !slices.Contains(strings.Split(string(env), "\x00"), want) {
			continue
		}
		ticks, state, err := procStat(pid)
		if err != nil || state == 'Z' || state == 'X' || syscallGetpgid(pid) != pid {
			continue // gone, or a descendant rather than the group leader we started
		}
		return &child{pid: pid, startTicks: ticks, providerID: req.ProviderID}, true
	}
	return nil, false
}

// syscallGetpgid is the process group of pid, or -1.
func syscallGetpgid(pid int) int {
	g, err := syscall.Getpgid(pid)
	if err != nil {
		return -1
	}
	return g
}

// exitMessage says how a reaped child ended.
func exitMessage(ws syscall.WaitStatus) string {
	switch {
	case ws.Exited() && ws.ExitStatus() == 0:
		return "process exited with status 0"
	case ws.Exited():
		return "process exited: exit status " + strconv.Itoa(ws.ExitStatus())
	case ws.Signaled():
		return "process exited: signal: " + ws.Signal().String()
	default:
		return "process exited"
	}
}

// alive reports whether the child still runs; callers hold p.mu.
func (p *Provider) alive(c *child) (bool, string) {
	if c.own && !c.exited {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(c.pid, &ws, syscall.WNOHANG, nil)
		for errors.Is(err, syscall.EINTR) {
			pid, err = syscall.Wait4(c.pid, &ws, syscall.WNOHANG, nil)
		}
		switch {
		case err == nil && pid == 0:
			return true, ""
		case err == nil:
			c.exited, c.status = true, ws
		default:
			// Not (or no longer) our child to wait for: judge by /proc.
			c.own = false
		}
	}
	if c.exited {
		return false, exitMessage(c.status)
	}
	ticks, state, err := procStat(c.pid)
	if err != nil || state == 'Z' || state == 'X' || (c.startTicks != 0 && ticks != c.startTicks) {
		return false, "process " + strconv.Itoa(c.pid) + " is gone"
	}
	return true, ""
}

func (p *Provider) observe(id string, c *child) provider.Instance {
	inst := provider.Instance{InstanceID: id, ProviderID: c.providerID, State: provider.StateRunning, Addresses: []string{"127.0.0.1"}}
	if p.cfg.HealthPort > 0 {
		inst.Addresses = []string{LoopbackAddr(id), "127.0.0.1"}
	}
	if ok, msg := p.alive(c); !ok {
		inst.State, inst.Message = provider.StateStopped, msg
	}
	return inst
}

// Status implements provider.Provider.
func (p *Provider) Status(ctx context.Context, id string) (provider.Instance, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.adoptOne(id)
	c, ok := p.children[id]
	if !ok {
		return provider.Instance{}, fmt.Errorf("process status %s: %w", id, provider.ErrNotFound)
	}
	return p.observe(id, c), nil
}

// List implements provider.Provider.
func (p *Provider) List(ctx context.Context) ([]provider.Instance, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.adopt(); err != nil {
		return nil, err
	}
	out := make([]provider.Instance, 0, len(p.children))
	for id, c := range p.children {
		out = append(out, p.observe(id, c))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].InstanceID < out[j].InstanceID })
	return out, nil
}

// PID returns the process id of an instance's agent.
func (p *Provider) PID(id string) (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	c, ok := p.children[id]
	if !ok {
		return 0, false
	}
	return c.pid, true
}

// Delete implements provider.Provider: SIGTERM to the process group, SIGKILL
// after StopTimeout, then the instance directory and Node file are removed.
func (p *Provider) Delete(ctx context.Context, id string) error {
	p.mu.Lock()
	p.waitCreate(id)
	p.adoptOne(id)
	c, ok := p.children[id]
	p.mu.Unlock()
	if ok {
		p.mu.Lock()
		running, _ := p.alive(c)
		p.mu.Unlock()
		if running {
			killGroup(c.pid, syscall.SIGTERM)
			if !p.waitGone(ctx, c, p.cfg.StopTimeout) {
				killGroup(c.pid, syscall.SIGKILL)
				p.waitGone(ctx, c, 5*time.Second)
			}
		}
	}
	if err := localagent.RemoveNode(p.cfg.NodeDir, id); err != nil {
		return fmt.Errorf("process delete %s: %w", id, err)
	}
	if err := localagent.Cleanup(p.cfg.StateDir, id); err != nil {
		return fmt.Errorf("process delete %s: %w", id, err)
	}
	p.mu.Lock()
	delete(p.children, id)
	p.mu.Unlock()
	return nil
}

// waitGone reports whether c's process is gone within d, checking every
// 20ms (false also when ctx ends first).
func (p *Provider) waitGone(ctx context.Context, c *child, d time.Duration) bool {
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, d, true, func(context.Context) (bool, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		running, _ := p.alive(c)
		return !running, nil
	})
	return err == nil
}

func killGroup(pid int, sig syscall.Signal) {
	if pid > 0 {
		_ = syscall.Kill(-pid, sig)
	}
}

// procStat returns the start time (clock ticks since boot) and state letter of pid.
func procStat(pid int) (uint64, byte, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, errors.New("malformed stat")
	}
	fields := strings.Fields(s[i+1:])
	// fields[0] is the state (field 3); start time is field 22, i.e. fields[19].
	if len(fields) < 20 || len(fields[0]) != 1 {
		return 0, 0, errors.New("malformed stat")
	}
	ticks, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return 0, 0, err
	}
	return ticks, fields[0][0], nil
}
