package proctest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// PollInterval is how often Wait checks its condition.
const PollInterval = 100 * time.Millisecond

// Wait checks cond at once and then every PollInterval until it holds; it
// fails when timeout passes or ctx ends first, naming what it waited for.
func Wait(ctx context.Context, what string, timeout time.Duration, cond func() bool) error {
	err := wait.PollUntilContextTimeout(ctx, PollInterval, timeout, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
	default:
		return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
	}
}

// Eventually is Wait that fails the test.
func Eventually(tb testing.TB, what string, timeout time.Duration, cond func() bool) {
	tb.Helper()
	if err := Wait(context.Background(), what, timeout, cond); err != nil {
		tb.Fatal(err)
	}
}

// HTTPOK reports whether a GET of url answers 200 within 2 seconds.
func HTTPOK(url string) bool {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Dialable reports whether every addr accepts a TCP connection within a
// second.
func Dialable(addrs ...string) bool {
	for _, a := range addrs {
		c, err := net.DialTimeout("tcp", a, time.Second)
		if err != nil {
			return false
		}
		c.Close()
	}
	return true
}

// Exists reports whether path exists.
func Exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// LogContains reports whether the file at path contains s.
func LogContains(path, s string) bool {
	b, err := os.ReadFile(path)
	return err == nil && strings.Contains(string(b), s)
}

// Tail returns the last n lines of the file at path (the error's text when
// it cannot be read).
func Tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "(no log: " + path + ")"
		}
		return err.Error()
	}
	return TailLines(string(b), n)
}

// TailLines returns the last n lines of s.
func TailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
