package userdata

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/go-logr/logr"
)

// Runner runs one user-data script once per agent process.
type Runner struct {
	// Path is the script; its directory is the working directory.
	Path string
	// Env is the script's environment (the agent's plus its own names).
	Env []string
	// Stdout and Stderr receive the script's output (the agent's own).
	Stdout, Stderr io.Writer
	Log            logr.Logger

	once sync.Once
	done chan struct{}
	err  error
}

// Start runs the script in the background the first time it is called
// (later calls do nothing); Wait returns its result.
func (r *Runner) Start(ctx context.Context) {
	r.once.Do(func() {
		r.done = make(chan struct{})
		go func() {
			defer close(r.done)
			r.err = r.run(ctx)
			switch {
			case errors.Is(r.err, errSkipped):
			case r.err != nil:
				r.Log.Error(r.err, "!!! user data script failed", "path", r.Path)
			default:
				r.Log.Info("user data script finished", "path", r.Path)
			}
		}()
	})
}

// Wait blocks until a started script ends and returns why it failed (nil
// when it succeeded or was skipped). It returns nil at once when Start was
// never called.
func (r *Runner) Wait() error {
	if r.done == nil {
		return nil
	}
	<-r.done
	if errors.Is(r.err, errSkipped) {
		return nil
	}
	return r.err
}

var errSkipped = errors.New("skipped")

func (r *Runner) run(ctx context.Context) error {
	data, err := os.ReadFile(r.Path)
	if errors.Is(err, os.ErrNotExist) {
		r.Log.Info("no user data", "path", r.Path)
		return errSkipped
	}
	if err != nil {
		return fmt.Errorf("reading user data: %w", err)
	}
	if !bytes.HasPrefix(data, []byte("#!")) {
		r.Log.Info("user data is not a script (no #! line); left for cloud-init", "path", r.Path, "bytes", len(data))
		return errSkipped
	}
	if err := os.Chmod(r.Path, 0o700); err != nil {
		return fmt.Errorf("making user data executable: %w", err)
	}
	cmd := exec.CommandContext(ctx, r.Path)
	cmd.Dir = filepath.Dir(r.Path)
	cmd.Env = r.Env
	cmd.Stdout, cmd.Stderr = r.Stdout, r.Stderr
	// When the agent stops, the script gets SIGTERM and 5 s before SIGKILL.
	// It stays in the agent's process group, so whatever stops the whole
	// instance (tmux closing its window, the process provider) stops it and
	// its children too; a script that starts a daemon should exec it.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	r.Log.Info("running user data script", "path", r.Path)
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("user data script %s: %w", r.Path, err)
	}
	return nil
}
