// Package cliconv is the command-line convention every Nstance binary
// follows, whatever reads its flags (urfave/cli, the standard flag package
// or the agent's environment):
//
//   - a usage error (unknown flag, bad value, unexpected argument, missing
//     required flag) is one line naming the problem, then the hint
//     "Run '<prog> --help' for usage.", and exit code 2; never a help dump;
//   - a runtime error (missing or unreadable file, a failed start) is one
//     line and exit code 1;
//   - --version (and a version command where a binary has commands) prints
//     version.String: "<prog> <version> (<commit>, <go version>, <os>/<arch>)".
//
// Report applies the first two to the error a command returns; Configure
// makes a urfave/cli application return its errors that way.
package cliconv

import (
	"errors"
	"fmt"
	"io"
	"strings"

	ucli "github.com/urfave/cli/v2"
)

// Exit codes.
const (
	ExitOK    = 0
	ExitError = 1
	ExitUsage = 2
)

// UsageError is a problem with the command line or the environment that
// stands in for it: the user typed something the program cannot take.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// Usage marks err as a usage error (nil stays nil).
func Usage(err error) error {
	if err == nil {
		return nil
	}
	var u *UsageError
	if errors.As(err, &u) {
		return err
	}
	return &UsageError{Err: err}
}

// Usagef is Usage(fmt.Errorf(format, args...)).
func Usagef(format string, args ...any) error { return Usage(fmt.Errorf(format, args...)) }

// IsUsage reports whether err is (or wraps) a usage error.
func IsUsage(err error) bool {
	var u *UsageError
	return errors.As(err, &u)
}

// Hint is the line that follows a usage error.
func Hint(prog string) string { return fmt.Sprintf("Run '%s --help' for usage.", prog) }

// OneLine joins the lines of a message (errors.Join puts each problem on
// its own line) with "; ".
func OneLine(msg string) string {
	var parts []string
	for _, l := range strings.Split(msg, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			parts = append(parts, l)
		}
	}
	return strings.Join(parts, "; ")
}

// Report writes err to w as the convention says and returns the exit code:
// 0 for nil; 2 and "<prog>: <problem>" plus the hint for a usage error; the
// code of a urfave/cli ExitCoder (its message, when it has one, on one line);
// 1 and "<prog>: <problem>" for anything else.
func Report(w io.Writer, prog string, err error) int {
	if err == nil {
		return ExitOK
	}
	// A message that already names the program is not prefixed twice.
	msg := strings.TrimPrefix(OneLine(err.Error()), prog+": ")
	if IsUsage(err) {
		fmt.Fprintf(w, "%s: %s\n%s\n", prog, msg, Hint(prog))
		return ExitUsage
	}
	code := ExitError
	var ec ucli.ExitCoder
	if errors.As(err, &ec) && ec.ExitCode() != 0 {
		code = ec.ExitCode()
	}
	if msg != "" {
		fmt.Fprintf(w, "%s: %s\n", prog, msg)
	}
	if code == ExitUsage {
		fmt.Fprintln(w, Hint(prog))
	}
	return code
}
