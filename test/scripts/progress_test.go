package scripts

import (
	"os/exec"
	"strings"
	"testing"
	"time"
)

// A slow step under progress_run: a start line, heartbeats no further apart
// than the interval allows, the end line with the elapsed time, the step's
// own output and status untouched, and nothing left running.
func TestProgressRunHeartbeat(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	s := startCmd(t, bashLib(t, root, `progress_run "slow step (three seconds)" bash -c 'echo step-output; sleep 3; exit 3' || echo "status $?"`))
	r, end := s.wait(t, 30*time.Second)
	if r.code != 0 {
		t.Fatalf("exit %d; output:\n%s", r.code, r.text())
	}
	requireGaps(t, r, end)
	first, beat := -1, -1
	for i, l := range r.lines {
		if l.text == "test: slow step (three seconds)" && first < 0 {
			first = i
		}
		if strings.HasPrefix(l.text, "test: slow step: still running") && beat < 0 {
			beat = i
		}
	}
	if first < 0 || beat < first {
		t.Errorf("want the line %q before the first heartbeat; output:\n%s", "test: slow step (three seconds)", r.text())
	}
	if n := r.count("test: slow step: still running ("); n < 2 {
		t.Errorf("%d heartbeat lines in 3s at a %s interval; output:\n%s", n, interval, r.text())
	}
	for _, want := range []string{"test: slow step: failed (exit 3) after 3s", "step-output"} {
		if !r.has(want) {
			t.Errorf("no line %q; output:\n%s", want, r.text())
		}
	}
	if !strings.Contains(r.stdout, "status 3") || !strings.Contains(r.stdout, "step-output") {
		t.Errorf("stdout %q: want the step's own output and its status 3", r.stdout)
	}
	if strings.Contains(r.stdout, "still running") {
		t.Errorf("heartbeat went to stdout: %q", r.stdout)
	}
	if !groupGone(s.cmd.Process.Pid) {
		t.Error("a process of the heartbeat is still running after the shell exited")
	}
}

// A daemon started by the step must not keep the heartbeat (and the
// caller's pipes) alive: progress_run returns when the step itself ends.
func TestProgressRunStepStartsDaemon(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	// The daemon keeps stdout and stderr; only its hold on the heartbeat pipe matters.
	s := startCmd(t, bashLib(t, root, `progress_run "step with daemon" bash -c 'sleep 30 >/dev/null 2>&1 & exit 0'; echo returned`))
	start := time.Now()
	s.waitFor(t, "returned", 20*time.Second)
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("progress_run took %s: the daemon held the heartbeat open", took)
	}
	r, _ := s.wait(t, 10*time.Second)
	if !r.has("test: step with daemon: done in") {
		t.Errorf("no done line; output:\n%s", r.text())
	}
}

func TestProgressWaitReady(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	flag := t.TempDir() + "/flag"
	s := startCmd(t, bashLib(t, root, `progress_wait "the flag file" 30 test -e "$FLAG"`, "FLAG="+flag))
	s.waitFor(t, "test: waiting for the flag file (limit 30s)", 10*time.Second)
	time.Sleep(2500 * time.Millisecond)
	if err := exec.Command("touch", flag).Run(); err != nil {
		t.Fatal(err)
	}
	r, end := s.wait(t, 30*time.Second)
	if r.code != 0 {
		t.Fatalf("exit %d; output:\n%s", r.code, r.text())
	}
	requireGaps(t, r, end)
	if n := r.count("test: still waiting for the flag file ("); n < 2 {
		t.Errorf("%d heartbeat lines in 2.5s at a %s interval; output:\n%s", n, interval, r.text())
	}
	if !r.has("of 30s)") || !r.has("test: the flag file: ready after") {
		t.Errorf("heartbeat lacks the limit or no ready line; output:\n%s", r.text())
	}
}

func TestProgressWaitGivesUp(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	r, end := run(t, bashLib(t, root, `progress_wait "something that never comes" 2 false || echo "status $?"`), 30*time.Second)
	requireGaps(t, r, end)
	if !r.has("test: gave up waiting for something that never comes after 2s") || !strings.Contains(r.stdout, "status 1") {
		t.Errorf("want the give-up line and status 1; output:\n%s", r.text())
	}
}

// Bad input is refused with a clear message, and the default interval keeps
// the 30s promise.
func TestProgressSettings(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	for _, bad := range []string{"x", "0", "-1", "0.0", "1s"} {
		r, _ := run(t, bashLib(t, root, `progress_run "step" true || echo "status $?"`, "NSTANCE_PROGRESS_INTERVAL="+bad), 10*time.Second)
		if !r.has("NSTANCE_PROGRESS_INTERVAL="+bad+": want a positive number of seconds") || !strings.Contains(r.stdout, "status 2") {
			t.Errorf("NSTANCE_PROGRESS_INTERVAL=%s: want a refusal and status 2; output:\n%s", bad, r.text())
		}
	}
	r, _ := run(t, bashLib(t, root, `progress_wait "x" 1.5 true || echo "status $?"`), 10*time.Second)
	if !r.has("limit '1.5' for x must be a whole number of seconds") || !strings.Contains(r.stdout, "status 2") {
		t.Errorf("fractional limit: output:\n%s", r.text())
	}
	cmd := exec.Command("bash", "-c", "unset NSTANCE_PROGRESS_INTERVAL; source scripts/lib/progress.sh; _progress_interval")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(out)) != "20" {
		t.Errorf("default interval %q (%v), want 20 (under the 30s promise with room for a slow step)", out, err)
	}
	for secs, want := range map[string]string{"0": "0s", "59": "59s", "60": "1m00s", "3725": "62m05s"} {
		cmd := exec.Command("bash", "-c", `source scripts/lib/progress.sh; progress_elapsed "$1"`, "x", secs)
		cmd.Dir = root
		out, err := cmd.Output()
		if err != nil || strings.TrimSpace(string(out)) != want {
			t.Errorf("progress_elapsed %s = %q (%v), want %s", secs, out, err, want)
		}
	}
}

// A progress_run inside another (here in a child script, as make inside
// .ci/run): only the innermost step beats, the outer one resumes after it,
// and the gaps stay within the bound throughout.
func TestProgressRunNested(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	inner := `source scripts/lib/progress.sh; PROGRESS_TAG=inner; sleep 1.5; progress_run "inner step" sleep 2.5; sleep 1.5`
	r, end := run(t, bashLib(t, root, `progress_run "outer step" bash -c '`+inner+`'`), 30*time.Second)
	if r.code != 0 {
		t.Fatalf("exit %d; output:\n%s", r.code, r.text())
	}
	requireGaps(t, r, end)
	var innerStart, innerEnd time.Time
	for _, l := range r.lines {
		switch l.text {
		case "inner: inner step":
			innerStart = l.at
		case "inner: inner step: done in 3s", "inner: inner step: done in 2s":
			innerEnd = l.at
		}
	}
	if innerStart.IsZero() || innerEnd.IsZero() {
		t.Fatalf("inner start or end missing; output:\n%s", r.text())
	}
	// The outer heartbeat checks for an inner step just before it prints, so
	// one outer line may still land right after the inner step's first line,
	// never later.
	var outerBefore, outerDuring, outerAfter, innerBeats int
	for _, l := range r.lines {
		switch {
		case strings.HasPrefix(l.text, "test: outer step: still running"):
			switch {
			case !l.at.After(innerStart):
				outerBefore++
			case l.at.After(innerEnd):
				outerAfter++
			default:
				outerDuring++
				if outerDuring > 1 || innerBeats > 0 {
					t.Errorf("outer heartbeat %q while the inner step reports; output:\n%s", l.text, r.text())
				}
			}
		case strings.HasPrefix(l.text, "inner: inner step: still running"):
			innerBeats++
		}
	}
	if outerBefore == 0 || outerAfter == 0 || innerBeats < 2 {
		t.Errorf("heartbeats: outer %d before and %d after the inner step, inner %d; output:\n%s", outerBefore, outerAfter, innerBeats, r.text())
	}
}
