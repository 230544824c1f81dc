package scripts

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// ciSandbox is a PATH holding only what .ci/run may use: links to a few real
// programs, fake go, make, sudo and apt-get that log their arguments, and
// whatever a test adds.
type ciSandbox struct {
	bin, log, cache string
}

func newCISandbox(t *testing.T, withAptGet bool) *ciSandbox {
	t.Helper()
	s := &ciSandbox{bin: t.TempDir(), log: filepath.Join(t.TempDir(), "calls.log"), cache: t.TempDir()}
	for _, p := range []string{"bash", "sh", "env", "date", "dirname", "basename", "mkdir", "mktemp", "rm", "mv", "cat", "chmod", "sleep", "awk", "flock", "git"} {
		real, err := exec.LookPath(p)
		if err != nil {
			if p == "flock" {
				continue // envtest-assets.sh falls back to a lock directory
			}
			t.Fatalf("%s is needed to build the sandbox: %v", p, err)
		}
		if err := os.Symlink(real, filepath.Join(s.bin, p)); err != nil {
			t.Fatal(err)
		}
	}
	logCall := `echo "$(basename "$0") $*" >> "$CALLS_LOG"` + "\n"
	writeScript(t, filepath.Join(s.bin, "go"), "#!/usr/bin/env bash\nset -eu\n"+logCall+`
case $1 in env) echo go1.26.0; exit 0 ;; build) ;; *) exit 2 ;; esac
out=
while (($#)); do if [[ $1 == -o ]]; then out=$2; shift; fi; shift; done
sleep "$FAKE_PAUSE"
if [[ $out == */ ]]; then
	printf '#!/bin/sh\necho "Kubernetes v`+k8sVersion+`"\n' > "$out/kube-apiserver"
	printf '#!/bin/sh\necho "Client Version: v`+k8sVersion+`"\n' > "$out/kubectl"
	chmod +x "$out/kube-apiserver" "$out/kubectl"
elif [[ $out == */kubemark ]]; then
	printf '#!/bin/sh\necho "Kubernetes v`+k8sVersion+`"\n' > "$out"
	chmod +x "$out"
elif [[ $out == */nstance-hollow-kubelet ]]; then
	printf '#!/bin/sh\necho "nstance-hollow-kubelet v`+k8sVersion+`"\n' > "$out"
	chmod +x "$out"
else
	printf '#!/bin/sh\necho "etcd Version: `+etcdVersion+`"\n' > "$out"
	chmod +x "$out"
fi
`)
	writeScript(t, filepath.Join(s.bin, "make"), "#!/usr/bin/env bash\n"+logCall+"echo \"fake make $*\"\nsleep \"$FAKE_PAUSE\"\n")
	writeScript(t, filepath.Join(s.bin, "sudo"), "#!/usr/bin/env bash\n"+logCall+"exec \"$@\"\n")
	if withAptGet {
		// "Installs" a package by putting its program into the sandbox.
		writeScript(t, filepath.Join(s.bin, "apt-get"), "#!/usr/bin/env bash\nset -eu\n"+logCall+`
echo "DEBIAN_FRONTEND=${DEBIAN_FRONTEND:-}" >> "$CALLS_LOG"
sleep "$FAKE_PAUSE"
[[ $1 == install ]] || exit 0
for p in "$@"; do
	case $p in -*|install) continue ;; awscli) tool=aws ;; procps) tool=ps ;; util-linux) tool=flock ;; systemd) tool=systemd-analyze ;; *) tool=$p ;; esac
	printf '#!/bin/sh\necho fake %s\n' "$tool" > "$(dirname "$0")/$tool"
	chmod +x "$(dirname "$0")/$tool"
done
`)
	}
	return s
}

// add puts a stand-in for a program into the sandbox.
func (s *ciSandbox) add(t *testing.T, names ...string) {
	for _, n := range names {
		writeScript(t, filepath.Join(s.bin, n), "#!/bin/sh\necho fake "+n+"\n")
	}
}

func (s *ciSandbox) cmd(root, pause string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(root, ".ci", "run"))
	cmd.Dir = t0Dir
	cmd.Env = []string{
		"PATH=" + s.bin,
		"HOME=" + s.cache,
		"NSTANCE_ENVTEST_CACHE=" + s.cache,
		fmt.Sprintf("NSTANCE_PROGRESS_INTERVAL=%g", interval.Seconds()),
		"CALLS_LOG=" + s.log,
		"FAKE_PAUSE=" + pause,
	}
	return cmd
}

// t0Dir: .ci/run must work from any directory.
const t0Dir = "/"

func (s *ciSandbox) calls(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(s.log)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// On a machine without tmux, the aws CLI, curl, ps, python3, chromium,
// systemd-analyze, shellcheck, gcc and haproxy, .ci/run
// installs exactly those with apt-get, says so, builds the envtest assets and
// runs make tools and make test, with progress at least every interval.
func TestCIRunInstallsMissingTools(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	s := newCISandbox(t, true)
	r, end := run(t, s.cmd(root, "1"), 2*time.Minute)
	if r.code != 0 {
		t.Fatalf("exit %d; output:\n%s", r.code, r.text())
	}
	requireGaps(t, r, end)
	calls := s.calls(t)
	want := []string{
		"apt-get update -qq",
		"DEBIAN_FRONTEND=",
		"apt-get install -y -qq --no-install-recommends tmux awscli curl procps python3 chromium systemd shellcheck gcc haproxy",
		"DEBIAN_FRONTEND=noninteractive",
	}
	var apt []string
	for _, c := range calls {
		if strings.HasPrefix(c, "apt-get") || strings.HasPrefix(c, "DEBIAN_FRONTEND") {
			apt = append(apt, c)
		}
	}
	if strings.Join(apt, "\n") != strings.Join(want, "\n") {
		t.Errorf("apt-get calls:\n%s\nwant:\n%s", strings.Join(apt, "\n"), strings.Join(want, "\n"))
	}
	var makes []string
	for _, c := range calls {
		if strings.HasPrefix(c, "make") {
			makes = append(makes, c)
		}
	}
	if strings.Join(makes, ";") != "make --no-print-directory tools;make --no-print-directory test" {
		t.Errorf("make calls %q, want tools then test", makes)
	}
	for _, line := range []string{
		"ci: installing tmux aws curl ps python3 chromium systemd-analyze shellcheck gcc haproxy (Debian packages: tmux awscli curl procps python3 chromium systemd shellcheck gcc haproxy)",
		"ci: tmux: installed (" + s.bin + "/tmux)",
		"ci: aws: installed (" + s.bin + "/aws)",
		"ci: git: present (",
		"ci: apt-get install tmux awscli curl procps python3 chromium systemd shellcheck gcc haproxy: still running (",
		"ci: make tools (pinned generators into ./bin)",
		"ci: make tools: still running (",
		"envtest-assets: building kube-apiserver and kubectl v" + k8sVersion,
		"envtest-assets: building kubemark v" + k8sVersion,
		"ci: make test: still running (",
		"ci: make test: done in",
	} {
		if !r.has(line) {
			t.Errorf("no line with %q; output:\n%s", line, r.text())
		}
	}
}

// With everything present .ci/run installs nothing.
func TestCIRunSkipsPresentTools(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	s := newCISandbox(t, true)
	s.add(t, "tmux", "aws", "curl", "ps", "python3", "flock", "chromium", "systemd-analyze", "shellcheck", "gcc", "haproxy")
	fakeBinaries(t, filepath.Join(s.cache, assetsDir), etcdVersion)
	r, end := run(t, s.cmd(root, "0.2"), time.Minute)
	if r.code != 0 {
		t.Fatalf("exit %d; output:\n%s", r.code, r.text())
	}
	requireGaps(t, r, end)
	for _, c := range s.calls(t) {
		if strings.HasPrefix(c, "apt-get") || strings.HasPrefix(c, "sudo") || strings.HasPrefix(c, "go build") {
			t.Errorf("unexpected call %q with every tool present and the envtest cache built", c)
		}
	}
	for _, tool := range []string{"git", "make", "bash", "tmux", "aws", "curl", "ps", "flock", "python3", "chromium", "systemd-analyze", "shellcheck", "gcc", "haproxy"} {
		if !r.has("ci: " + tool + ": present (") {
			t.Errorf("no 'present' line for %s; output:\n%s", tool, r.text())
		}
	}
	if !r.has("envtest-assets: cached in") {
		t.Errorf("envtest assets not reported cached; output:\n%s", r.text())
	}
}

// Without apt-get or without Go, .ci/run stops before doing anything and
// says what is missing.
func TestCIRunExplainsWhatIsMissing(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	s := newCISandbox(t, false)
	s.add(t, "aws", "curl", "ps", "python3", "flock", "chromium", "systemd-analyze", "shellcheck", "gcc", "haproxy")
	r, _ := run(t, s.cmd(root, "0"), time.Minute)
	if r.code != 1 || !r.has("ci: error: missing: tmux; there is no apt-get here: install them (packages tmux on Debian) and rerun") {
		t.Errorf("exit %d; want 1 and the missing tmux named; output:\n%s", r.code, r.text())
	}
	if calls := s.calls(t); len(calls) > 0 && !strings.HasPrefix(calls[0], "go env") {
		t.Errorf("calls before giving up: %q", calls)
	}

	s = newCISandbox(t, true)
	if err := os.Remove(filepath.Join(s.bin, "go")); err != nil {
		t.Fatal(err)
	}
	r, _ = run(t, s.cmd(root, "0"), time.Minute)
	if r.code != 1 || !r.has("ci: error: go is required but missing: install Go 1.26") {
		t.Errorf("exit %d; want 1 and Go named; output:\n%s", r.code, r.text())
	}
	if calls := s.calls(t); len(calls) > 0 {
		t.Errorf("calls without Go: %q", calls)
	}
}
