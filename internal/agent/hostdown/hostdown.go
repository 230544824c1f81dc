package hostdown

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// Modes of NSTANCE_SHUTDOWN_DETECT.
const (
	ModeAuto   = "auto"
	ModeAlways = "always"
	ModeNever  = "never"
)

// ParseMode accepts auto (also ""), always and never.
func ParseMode(s string) (string, error) {
	switch s {
	case "", ModeAuto:
		return ModeAuto, nil
	case ModeAlways, ModeNever:
		return s, nil
	}
	return "", fmt.Errorf("%q is not auto, always or never", s)
}

// DefaultSystemdDir exists on hosts that systemd booted.
const DefaultSystemdDir = "/run/systemd/system"

// checkTimeout bounds the systemd question: the agent is stopping.
const checkTimeout = 500 * time.Millisecond

// Detector answers Check. The zero value is mode auto on the real host.
type Detector struct {
	Mode string
	// SystemdDir replaces DefaultSystemdDir (tests).
	SystemdDir string
	// SystemState replaces running `systemctl is-system-running` (tests);
	// it returns the state word systemd prints.
	SystemState func(ctx context.Context) (string, error)
}

// Check returns a shutdown notice when the host is going down, else nil;
// with an error when it could not tell (the agent then says nothing).
func (d *Detector) Check(ctx context.Context) (*nstancev1.TerminationNotice, error) {
	switch d.Mode {
	case ModeNever:
		return nil, nil
	case ModeAlways:
		return &nstancev1.TerminationNotice{Kind: nstancev1.TerminationKind_TERMINATION_KIND_SHUTDOWN,
			Message: "agent stopped; NSTANCE_SHUTDOWN_DETECT=always takes that as the host going down"}, nil
	}
	dir := d.SystemdDir
	if dir == "" {
		dir = DefaultSystemdDir
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil, nil // no systemd: nothing tells a shutdown from a restart
	} else if err != nil {
		return nil, fmt.Errorf("hostdown: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	state := d.SystemState
	if state == nil {
		state = systemState
	}
	s, err := state(ctx)
	if err != nil {
		return nil, fmt.Errorf("hostdown: asking systemd for the system state: %w", err)
	}
	if s != "stopping" {
		return nil, nil
	}
	return &nstancev1.TerminationNotice{Kind: nstancev1.TerminationKind_TERMINATION_KIND_SHUTDOWN,
		Message: "host shutting down (systemd system state: stopping)"}, nil
}

// systemState runs systemctl is-system-running, which exits non-zero for
// every state but running: its output is the answer either way.
func systemState(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "systemctl", "is-system-running").Output()
	s := strings.TrimSpace(string(out))
	if s == "" && err != nil {
		return "", err
	}
	return s, nil
}
