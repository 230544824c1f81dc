package proctest

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Options configures a Group.
type Options struct {
	// Bin is the directory holding the binaries Start names.
	Bin string
	// Dir is the processes' working directory.
	Dir string
	// LogDir holds each process's log, <name>.log (default Dir/logs).
	LogDir string
	// Env is the environment every process starts with: nil means
	// os.Environ(), an empty slice nothing; Start appends its own.
	Env []string
	// Grace is how long Close waits after SIGTERM before SIGKILL; 0 kills at
	// once.
	Grace time.Duration
	// TailLines is how many last lines of each log Close prints when the
	// test failed (default 40).
	TailLines int
}

// Group is the set of processes of one stack. NewGroup registers Close as
// a cleanup of the test.
type Group struct {
	opts Options
	tb   testing.TB

	mu     sync.Mutex
	procs  []*Proc
	closed bool
}

// NewGroup returns an empty group; its processes are stopped at the test's
// cleanup (or at an earlier Close).
func NewGroup(tb testing.TB, opts Options) *Group {
	if opts.LogDir == "" {
		opts.LogDir = filepath.Join(opts.Dir, "logs")
	}
	if opts.Env == nil {
		opts.Env = os.Environ()
	}
	if opts.TailLines == 0 {
		opts.TailLines = 40
	}
	g := &Group{opts: opts, tb: tb}
	tb.Cleanup(g.Close)
	return g
}

// Start runs binary (a name in Options.Bin, or an absolute path) with the
// group's environment followed by env, its output in LogDir/<name>.log.
func (g *Group) Start(name, binary string, env []string, args ...string) (*Proc, error) {
	bin := binary
	if !filepath.IsAbs(bin) {
		bin = filepath.Join(g.opts.Bin, binary)
	}
	all := append(append([]string(nil), g.opts.Env...), env...)
	p, err := Start(name, filepath.Join(g.opts.LogDir, name+".log"), g.opts.Dir, all, bin, args...)
	if err != nil {
		return nil, err
	}
	g.Add(p)
	return p, nil
}

// MustStart is Start that fails the test on an error.
func (g *Group) MustStart(name, binary string, env []string, args ...string) *Proc {
	g.tb.Helper()
	p, err := g.Start(name, binary, env, args...)
	if err != nil {
		g.tb.Fatal(err)
	}
	return p
}

// Restart runs an exited process of the group again (Proc.Restart) and
// keeps the new one in the group.
func (g *Group) Restart(p *Proc) (*Proc, error) {
	n, err := p.Restart()
	if err != nil {
		return nil, err
	}
	g.Add(n)
	return n, nil
}

// Add puts a process started elsewhere into the group. A process added
// after Close is stopped at once.
func (g *Group) Add(p *Proc) {
	g.mu.Lock()
	closed := g.closed
	if !closed {
		g.procs = append(g.procs, p)
	}
	g.mu.Unlock()
	if closed {
		p.Stop(g.opts.Grace)
	}
}

// Close stops every process in reverse start order (Proc.Stop with
// Options.Grace) and, when the test failed, prints each log's last lines.
// Later calls do nothing.
func (g *Group) Close() {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return
	}
	g.closed = true
	procs := append([]*Proc(nil), g.procs...)
	g.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop(g.opts.Grace)
	}
	if !g.tb.Failed() {
		return
	}
	seen := map[string]bool{}
	for _, p := range procs {
		if seen[p.Log] { // a restarted process appends to its log
			continue
		}
		seen[p.Log] = true
		g.tb.Logf("---- %s (%s), last lines:\n%s", p.Name, p.Log, Tail(p.Log, g.opts.TailLines))
	}
}
