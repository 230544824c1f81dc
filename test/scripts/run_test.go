package scripts

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// interval is the heartbeat interval the tests run the scripts with, and
// maxGap the longest silence they accept between two output lines: the
// interval plus generous room for a loaded machine. In production the
// interval is 20s against a 30s promise.
const (
	interval = 500 * time.Millisecond
	maxGap   = interval + 2*time.Second
)

func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Clean(filepath.Join(wd, "..", ".."))
	if _, err := os.Stat(filepath.Join(root, "scripts", "lib", "progress.sh")); err != nil {
		t.Fatalf("repository root not found from %s", wd)
	}
	return root
}

// line is one line of output and when the test read it.
type line struct {
	at   time.Time
	text string
}

// result is a finished command: its lines (stdout and stderr merged, in
// arrival order), stdout alone, and its exit status.
type result struct {
	start  time.Time
	lines  []line
	stdout string
	code   int
}

func (r result) text() string {
	var b strings.Builder
	for _, l := range r.lines {
		fmt.Fprintf(&b, "%6.2fs %s\n", l.at.Sub(r.start).Seconds(), l.text)
	}
	return b.String()
}

// has reports whether some line contains s.
func (r result) has(s string) bool {
	for _, l := range r.lines {
		if strings.Contains(l.text, s) {
			return true
		}
	}
	return false
}

// count is how many lines contain s.
func (r result) count(s string) int {
	n := 0
	for _, l := range r.lines {
		if strings.Contains(l.text, s) {
			n++
		}
	}
	return n
}

// requireGaps fails when two consecutive lines (or the start and the first
// line, or the last line and the end) are further apart than maxGap.
func requireGaps(t *testing.T, r result, end time.Time) {
	t.Helper()
	prev := r.start
	for _, l := range r.lines {
		if gap := l.at.Sub(prev); gap > maxGap {
			t.Errorf("%.2fs without output before %q (limit %s)", gap.Seconds(), l.text, maxGap)
		}
		prev = l.at
	}
	if gap := end.Sub(prev); gap > maxGap {
		t.Errorf("%.2fs without output before the command ended (limit %s)", gap.Seconds(), maxGap)
	}
}

// started is a running command whose output lines are being collected.
type started struct {
	cmd   *exec.Cmd
	start time.Time
	mu    sync.Mutex
	lines []line
	out   strings.Builder // stdout only
	done  chan struct{}   // closed when both pipes reached EOF
}

// startCmd runs cmd in its own process group, timestamping every line of
// stdout and stderr as it arrives.
func startCmd(t *testing.T, cmd *exec.Cmd) *started {
	t.Helper()
	s := &started{cmd: cmd, done: make(chan struct{})}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	s.start = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	var wg sync.WaitGroup
	read := func(r io.Reader, keep bool) {
		defer wg.Done()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			s.mu.Lock()
			s.lines = append(s.lines, line{time.Now(), sc.Text()})
			if keep {
				s.out.WriteString(sc.Text() + "\n")
			}
			s.mu.Unlock()
		}
	}
	wg.Add(2)
	go read(stdout, true)
	go read(stderr, false)
	go func() { wg.Wait(); close(s.done) }()
	return s
}

// waitFor polls until some output line contains text.
func (s *started) waitFor(t *testing.T, text string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		for _, l := range s.lines {
			if strings.Contains(l.text, text) {
				s.mu.Unlock()
				return
			}
		}
		s.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no line with %q after %s; output:\n%s", text, limit, s.snapshot().text())
}

func (s *started) snapshot() result {
	s.mu.Lock()
	defer s.mu.Unlock()
	return result{start: s.start, lines: append([]line(nil), s.lines...), stdout: s.out.String()}
}

// wait waits for the command to exit (at most limit) and returns its result
// and when it ended.
func (s *started) wait(t *testing.T, limit time.Duration) (result, time.Time) {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(limit):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		t.Fatalf("%s still running after %s; output:\n%s", s.cmd, limit, s.snapshot().text())
	}
	err := s.cmd.Wait()
	end := time.Now()
	r := s.snapshot()
	r.code = 0
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("%s: %v", s.cmd, err)
	}
	return r, end
}

// run runs a command to the end (at most limit).
func run(t *testing.T, cmd *exec.Cmd, limit time.Duration) (result, time.Time) {
	t.Helper()
	return startCmd(t, cmd).wait(t, limit)
}

// bashLib runs a bash snippet with scripts/lib/progress.sh sourced.
func bashLib(t *testing.T, root, snippet string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("bash", "-c", "set -euo pipefail; source scripts/lib/progress.sh; PROGRESS_TAG=test; "+snippet)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), append([]string{fmt.Sprintf("NSTANCE_PROGRESS_INTERVAL=%g", interval.Seconds())}, env...)...)
	return cmd
}

// groupGone reports whether no process of process group pgid is left.
func groupGone(pgid int) bool {
	return errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH)
}

// writeScript writes an executable shell script. It replaces what is at
// path rather than writing through it: path may be a symlink to a real
// program of the host (the .ci/run sandbox), which must stay untouched.
func writeScript(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(body); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}
