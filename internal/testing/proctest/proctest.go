// Package proctest runs the repository's binaries as child processes for
// black-box suites (test/e2e, test/attack): one `go build` of the commands a
// suite needs, each child in its own process group with its output in a log
// file, and stopped by its PID only.
package proctest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// RepoRoot is the directory holding go.mod, found from the working
// directory upwards.
func RepoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
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
		return fmt.Errorf("go build: %v\n%s", err, out)
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
}

// Start runs bin with args in dir with env as its whole environment, in its
// own process group, its output written to logPath (created, with its
// directory).
func Start(name, logPath, dir string, env []string, bin string, args ...string) (*Proc, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, err
	}
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Proc{Name: name, Cmd: cmd, Log: logPath, Done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(p.Done) }()
	return p, nil
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.Done:
		return true
	default:
		return false
	}
}

// Stop ends the process group: SIGTERM, then SIGKILL after grace.
func (p *Proc) Stop(grace time.Duration) {
	if p.Exited() {
		return
	}
	_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.Done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
		<-p.Done
	}
}
