package proctest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// RepoRoot is the directory holding go.mod, found from the working
// directory upwards.
func RepoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		if filepath.Dir(dir) == dir {
			return "", fmt.Errorf("no go.mod above %s", wd)
		}
	}
}

// Root is RepoRoot for a test: a failure fails it.
func Root(tb testing.TB) string {
	tb.Helper()
	root, err := RepoRoot()
	if err != nil {
		tb.Fatal(err)
	}
	return root
}

// Build compiles ./cmd/<name> of the repository at root for every name into
// dir with one `go build` (packages compile once, in parallel).
func Build(root, dir string, names ...string) error {
	if len(names) == 0 {
		return errors.New("proctest: nothing to build")
	}
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, n := range names {
		args = append(args, "./cmd/"+n)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %v: %w\n%s", names, err, out)
	}
	return nil
}

// Proc is one child process started by Start.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	// Log is the file holding its stdout and stderr.
	Log string
	// Done is closed once the process has exited.
	Done chan struct{}

	dir, bin string
	env      []string
	args     []string
}

// Start runs bin with args in dir with env as its whole environment, in its
// own process group, its output written to logPath (created, with its
// directory; an existing file is truncated).
func Start(name, logPath, dir string, env []string, bin string, args ...string) (*Proc, error) {
	p := &Proc{Name: name, Log: logPath, dir: dir, bin: bin, env: env, args: args}
	return p, p.start(os.O_TRUNC)
}

// Restart runs p's command again, with the same directory, environment and
// arguments, once p has exited; its output is appended to the same log.
func (p *Proc) Restart() (*Proc, error) {
	if !p.Exited() {
		return nil, fmt.Errorf("restarting %s: it still runs (pid %d)", p.Name, p.Pid())
	}
	n := &Proc{Name: p.Name, Log: p.Log, dir: p.dir, bin: p.bin, env: p.env, args: p.args}
	return n, n.start(os.O_APPEND)
}

func (p *Proc) start(mode int) error {
	if err := os.MkdirAll(filepath.Dir(p.Log), 0o755); err != nil {
		return fmt.Errorf("log directory of %s: %w", p.Name, err)
	}
	f, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|mode, 0o644)
	if err != nil {
		return fmt.Errorf("log of %s: %w", p.Name, err)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Dir = p.dir
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("starting %s: %w", p.Name, err)
	}
	p.Cmd, p.Done = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); f.Close(); close(p.Done) }()
	return nil
}

// Pid is the process's PID (and its process group's id).
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.Done:
		return true
	default:
		return false
	}
}

// Signal sends sig to the process alone (not its group).
func (p *Proc) Signal(sig syscall.Signal) error {
	if err := p.Cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %s to %s (pid %d): %w", sig, p.Name, p.Pid(), err)
	}
	return nil
}

// Stop ends the process group: SIGTERM (and SIGCONT, so that a stopped
// process handles it), then SIGKILL after grace; with grace 0, SIGKILL at
// once. It returns once the process has exited.
func (p *Proc) Stop(grace time.Duration) {
	if p.Exited() {
		return
	}
	pgid := -p.Pid()
	if grace > 0 {
		_ = syscall.Kill(pgid, syscall.SIGTERM)
		_ = syscall.Kill(pgid, syscall.SIGCONT)
		select {
		case <-p.Done:
			return
		case <-time.After(grace):
		}
	}
	_ = syscall.Kill(pgid, syscall.SIGKILL)
	<-p.Done
}

// Kill is Stop without a grace period: SIGKILL to the process group.
func (p *Proc) Kill() { p.Stop(0) }

// WaitFor is Wait that also gives up when the process exits, with the last
// lines of its log in the error.
func (p *Proc) WaitFor(ctx context.Context, what string, timeout time.Duration, cond func() bool) error {
	err := Wait(ctx, what, timeout, func() bool { return p.Exited() || cond() })
	if p.Exited() {
		return errors.Join(err, fmt.Errorf("%s exited (%s) while waiting for %s; last lines of %s:\n%s",
			p.Name, p.Cmd.ProcessState, what, p.Log, Tail(p.Log, 10)))
	}
	return err
}
