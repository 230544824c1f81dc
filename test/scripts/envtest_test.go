package scripts

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	k8sVersion  = "1.36.3"
	etcdVersion = "3.6.16"
	assetsDir   = "k8s-" + k8sVersion + "-etcd-" + etcdVersion
)

// fakeBinaries writes stand-ins for the three envtest binaries and kubemark
// into dir. The fake etcd prints its version and then a lot more, as the real
// one does: a check that piped it into `grep -q` would kill it with SIGPIPE.
func fakeBinaries(t *testing.T, dir, etcdVer string) {
	t.Helper()
	fakeControlPlane(t, dir, etcdVer)
	writeScript(t, filepath.Join(dir, "kubemark"), "#!/bin/sh\necho 'Kubernetes v"+k8sVersion+"'\n")
	writeScript(t, filepath.Join(dir, "nstance-hollow-kubelet"), "#!/bin/sh\necho 'nstance-hollow-kubelet v"+k8sVersion+"'\n")
}

// fakeControlPlane writes the three envtest binaries only (a cache from
// before kubemark was added).
func fakeControlPlane(t *testing.T, dir, etcdVer string) {
	t.Helper()
	writeScript(t, filepath.Join(dir, "kube-apiserver"), "#!/bin/sh\necho 'Kubernetes v"+k8sVersion+"'\n")
	writeScript(t, filepath.Join(dir, "kubectl"), "#!/bin/sh\necho 'Client Version: v"+k8sVersion+"'\n")
	writeScript(t, filepath.Join(dir, "etcd"), "#!/bin/sh\necho 'etcd Version: "+etcdVer+"'\n"+
		"i=0; while [ $i -lt 4000 ]; do echo 'Git SHA: Not provided (use ./build instead of go build) Go Version: go1.26'; i=$((i+1)); done\n")
}

// fakeGo puts a `go` first in PATH that builds the fake binaries after a
// pause and appends one line per call to the returned log, starting with the
// call's CGO_ENABLED.
func fakeGo(t *testing.T, pause string) (pathEnv, log string) {
	t.Helper()
	bin := t.TempDir()
	log = filepath.Join(t.TempDir(), "go.log")
	writeScript(t, filepath.Join(bin, "go"), `#!/usr/bin/env bash
set -eu
echo "CGO_ENABLED=${CGO_ENABLED:-} $*" >> "$FAKE_GO_LOG"
case $1 in env) echo go1.26.0; exit 0 ;; build) ;; *) echo "fake go: $1 unsupported" >&2; exit 2 ;; esac
out=
while (($#)); do if [[ $1 == -o ]]; then out=$2; shift; fi; shift; done
sleep "$FAKE_GO_PAUSE"
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
	return "PATH=" + bin + ":" + os.Getenv("PATH"), log
}

// envtestCmd runs scripts/envtest-assets.sh against cache.
func envtestCmd(root, cache string, env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(root, "scripts", "envtest-assets.sh"), args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), append([]string{
		"NSTANCE_ENVTEST_CACHE=" + cache,
		fmt.Sprintf("NSTANCE_PROGRESS_INTERVAL=%g", interval.Seconds()),
	}, env...)...)
	return cmd
}

// checkMany runs --check n times, four at a time, and returns the failures.
func checkMany(t *testing.T, root, cache string, n int) []string {
	t.Helper()
	var (
		mu       sync.Mutex
		failures []string
		wg       sync.WaitGroup
		jobs     = make(chan int)
	)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				cmd := envtestCmd(root, cache, nil, "--check")
				out, err := cmd.CombinedOutput()
				if err != nil || !strings.Contains(string(out), "cached and complete in") {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("run %d: %v: %s", i, err, out))
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	return failures
}

// The cache check on the real cached binaries gives the same answer 200
// times in a row (it used to fail about one time in four).
func TestEnvtestCheckRealCache(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	out, err := exec.Command(filepath.Join(root, "scripts", "envtest-assets.sh"), "--dir").Output()
	if err != nil {
		t.Fatalf("envtest-assets.sh --dir: %v", err)
	}
	dir := strings.TrimSpace(string(out))
	for _, b := range []string{"kube-apiserver", "etcd", "kubectl", "kubemark", "nstance-hollow-kubelet"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			t.Skipf("the envtest cache is not built (%s missing): run `make envtest-assets` first (.ci/run and `make test` build it before the tests)", filepath.Join(dir, b))
		}
	}
	cache := filepath.Dir(dir)
	if failures := checkMany(t, root, cache, 200); len(failures) > 0 {
		t.Fatalf("%d of 200 checks of %s failed; first: %s", len(failures), dir, failures[0])
	}
}

func TestEnvtestCheck(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)

	t.Run("complete cache with a chatty etcd", func(t *testing.T) {
		cache := t.TempDir()
		fakeBinaries(t, filepath.Join(cache, assetsDir), etcdVersion)
		if failures := checkMany(t, root, cache, 40); len(failures) > 0 {
			t.Fatalf("%d of 40 checks failed; first: %s", len(failures), failures[0])
		}
	})
	for _, tc := range []struct {
		name, want string
		prepare    func(dir string)
	}{
		{"empty cache", "kube-apiserver is missing", func(string) {}},
		{"kubectl missing", "kubectl is missing", func(dir string) {
			fakeBinaries(t, dir, etcdVersion)
			_ = os.Remove(filepath.Join(dir, "kubectl"))
		}},
		{"kubemark missing", "kubemark is missing", func(dir string) { fakeControlPlane(t, dir, etcdVersion) }},
		{"wrong kubemark version", "kubemark reports 'Kubernetes v1.35.0', want v" + k8sVersion, func(dir string) {
			fakeBinaries(t, dir, etcdVersion)
			writeScript(t, filepath.Join(dir, "kubemark"), "#!/bin/sh\necho 'Kubernetes v1.35.0'\n")
		}},
		{"hollow kubelet missing", "nstance-hollow-kubelet is missing", func(dir string) {
			fakeBinaries(t, dir, etcdVersion)
			_ = os.Remove(filepath.Join(dir, "nstance-hollow-kubelet"))
		}},
		{"wrong etcd version", "etcd reports 'etcd Version: 3.5.0', want " + etcdVersion, func(dir string) { fakeBinaries(t, dir, "3.5.0") }},
		{"etcd fails", "etcd --version failed", func(dir string) {
			fakeBinaries(t, dir, etcdVersion)
			writeScript(t, filepath.Join(dir, "etcd"), "#!/bin/sh\necho broken >&2; exit 3\n")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cache := t.TempDir()
			dir := filepath.Join(cache, assetsDir)
			tc.prepare(dir)
			before := listDir(t, cache)
			out, err := envtestCmd(root, cache, nil, "--check").CombinedOutput()
			if code := exitCode(err); code != 1 || !strings.Contains(string(out), tc.want) {
				t.Errorf("exit %d, output %q; want 1 and %q", code, out, tc.want)
			}
			if after := listDir(t, cache); after != before {
				t.Errorf("--check changed the cache: before %q, after %q", before, after)
			}
		})
	}
	t.Run("unknown argument", func(t *testing.T) {
		out, err := envtestCmd(root, t.TempDir(), nil, "--chekc").CombinedOutput()
		if code := exitCode(err); code != 2 || !strings.Contains(string(out), "usage: scripts/envtest-assets.sh [--force | --check | --dir]") {
			t.Errorf("exit %d, output %q; want 2 and the usage", code, out)
		}
	})
}

// A build says what it builds and reports elapsed time while it runs; the
// result passes --check.
func TestEnvtestBuildProgress(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	cache := t.TempDir()
	path, log := fakeGo(t, "2")
	r, end := run(t, envtestCmd(root, cache, []string{path, "FAKE_GO_LOG=" + log, "FAKE_GO_PAUSE=2"}), time.Minute)
	if r.code != 0 {
		t.Fatalf("exit %d; output:\n%s", r.code, r.text())
	}
	requireGaps(t, r, end)
	dir := filepath.Join(cache, assetsDir)
	if strings.TrimSpace(r.stdout) != dir {
		t.Errorf("stdout %q, want only %s", r.stdout, dir)
	}
	for _, want := range []string{
		"envtest-assets: building into " + dir + " because " + dir + "/kube-apiserver is missing",
		"envtest-assets: building kube-apiserver and kubectl v" + k8sVersion,
		"envtest-assets: building etcd v" + etcdVersion,
		"envtest-assets: building kube-apiserver and kubectl v" + k8sVersion + ": still running (",
		"envtest-assets: building etcd v" + etcdVersion + ": done in",
		"envtest-assets: building kubemark v" + k8sVersion,
		"envtest-assets: building kubemark v" + k8sVersion + ": done in",
		"envtest-assets: building nstance-hollow-kubelet v" + k8sVersion + ": done in",
		"envtest-assets: built in",
	} {
		if !r.has(want) {
			t.Errorf("no line with %q; output:\n%s", want, r.text())
		}
	}
	if n := r.count("still running ("); n < 8 {
		t.Errorf("%d heartbeat lines over four 2s builds at a %s interval; output:\n%s", n, interval, r.text())
	}
	calls := readLines(t, log)
	if len(calls) != 4 {
		t.Errorf("go called %d times, want 4 (kube-apiserver+kubectl, etcd, kubemark, nstance-hollow-kubelet): %q", len(calls), calls)
	}
	for _, c := range calls {
		hollow := strings.HasSuffix(c, "k8s.io/kubernetes/cmd/kubemark") || strings.HasSuffix(c, "./cmd/nstance-hollow-kubelet")
		if strings.HasPrefix(c, "CGO_ENABLED=1_") != hollow {
			t.Errorf("go call %q: the hollow kubelets (only) must be built with CGO_ENABLED=1", c)
		}
	}
	if out, err := envtestCmd(root, cache, nil, "--check").CombinedOutput(); err != nil {
		t.Errorf("--check after the build: %v: %s", err, out)
	}
	if entries := listDir(t, cache); entries != ".lock "+assetsDir {
		t.Errorf("cache holds %q; want only the lock file and %s (no leftover build directory)", entries, assetsDir)
	}
}

// A cache holding the three envtest binaries but no kubemark gets kubemark
// alone: the control plane is neither rebuilt nor replaced.
func TestEnvtestBuildsOnlyMissingKubemark(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	cache := t.TempDir()
	dir := filepath.Join(cache, assetsDir)
	fakeControlPlane(t, dir, etcdVersion)
	apiserver := filepath.Join(dir, "kube-apiserver")
	before, err := os.Stat(apiserver)
	if err != nil {
		t.Fatal(err)
	}
	path, log := fakeGo(t, "0")
	r, _ := run(t, envtestCmd(root, cache, []string{path, "FAKE_GO_LOG=" + log, "FAKE_GO_PAUSE=0"}), time.Minute)
	if r.code != 0 || strings.TrimSpace(r.stdout) != dir {
		t.Fatalf("exit %d, stdout %q; want 0 and %s; output:\n%s", r.code, r.stdout, dir, r.text())
	}
	for _, want := range []string{
		"envtest-assets: building into " + dir + " because " + dir + "/kubemark is missing",
		"envtest-assets: building kubemark v" + k8sVersion + ": done in",
		"envtest-assets: building nstance-hollow-kubelet v" + k8sVersion + ": done in",
		"envtest-assets: built kubemark and nstance-hollow-kubelet in",
	} {
		if !r.has(want) {
			t.Errorf("no line with %q; output:\n%s", want, r.text())
		}
	}
	calls := readLines(t, log)
	if len(calls) != 2 || !strings.HasPrefix(calls[0], "CGO_ENABLED=1_build") || !strings.HasSuffix(calls[0], "k8s.io/kubernetes/cmd/kubemark") ||
		!strings.HasPrefix(calls[1], "CGO_ENABLED=1_build") || !strings.HasSuffix(calls[1], "./cmd/nstance-hollow-kubelet") {
		t.Errorf("go calls %q; want cgo builds of k8s.io/kubernetes/cmd/kubemark and ./cmd/nstance-hollow-kubelet", calls)
	}
	after, err := os.Stat(apiserver)
	if err != nil {
		t.Fatal(err)
	}
	if !os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("%s was replaced; only kubemark should have been built", apiserver)
	}
	if out, err := envtestCmd(root, cache, nil, "--check").CombinedOutput(); err != nil {
		t.Errorf("--check after building kubemark: %v: %s", err, out)
	}
	if entries := listDir(t, cache); entries != ".lock "+assetsDir {
		t.Errorf("cache holds %q; want only the lock file and %s (no leftover build directory)", entries, assetsDir)
	}
}

// A caller that finds another build running waits for it, says so, and then
// uses its result instead of building again.
func TestEnvtestWaitsForRunningBuild(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("flock(1) is not installed; the script uses its lock-directory fallback")
	}
	cache := t.TempDir()
	lock, err := os.OpenFile(filepath.Join(cache, ".lock"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	path, log := fakeGo(t, "0")
	s := startCmd(t, envtestCmd(root, cache, []string{path, "FAKE_GO_LOG=" + log, "FAKE_GO_PAUSE=0"}))
	s.waitFor(t, "another envtest-assets.sh is building in "+cache+"; waiting for it to finish", 20*time.Second)
	time.Sleep(1500 * time.Millisecond) // a heartbeat or more while it waits
	fakeBinaries(t, filepath.Join(cache, assetsDir), etcdVersion)
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_UN); err != nil {
		t.Fatal(err)
	}
	r, end := s.wait(t, 30*time.Second)
	if r.code != 0 {
		t.Fatalf("exit %d; output:\n%s", r.code, r.text())
	}
	requireGaps(t, r, end)
	if !r.has("envtest-assets: cached in " + filepath.Join(cache, assetsDir) + " (built while this call waited)") {
		t.Errorf("no 'built while this call waited' line; output:\n%s", r.text())
	}
	if !r.has("waiting for it to finish: still running (") {
		t.Errorf("no heartbeat while waiting; output:\n%s", r.text())
	}
	if calls := readLines(t, log); len(calls) != 0 {
		t.Errorf("the waiting caller ran go: %q", calls)
	}
}

// Two callers on an empty cache at once: one build, both get the directory.
func TestEnvtestConcurrentCallersBuildOnce(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	cache := t.TempDir()
	path, log := fakeGo(t, "1")
	env := []string{path, "FAKE_GO_LOG=" + log, "FAKE_GO_PAUSE=1"}
	a := startCmd(t, envtestCmd(root, cache, env))
	b := startCmd(t, envtestCmd(root, cache, env))
	ra, _ := a.wait(t, time.Minute)
	rb, _ := b.wait(t, time.Minute)
	dir := filepath.Join(cache, assetsDir)
	for _, r := range []result{ra, rb} {
		if r.code != 0 || strings.TrimSpace(r.stdout) != dir {
			t.Errorf("exit %d, stdout %q; want 0 and %s; output:\n%s", r.code, r.stdout, dir, r.text())
		}
	}
	if calls := readLines(t, log); len(calls) != 4 {
		t.Errorf("go called %d times, want 4 (one build: kube-apiserver+kubectl, etcd, kubemark, nstance-hollow-kubelet): %q", len(calls), calls)
	}
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if e, ok := err.(*exec.ExitError); ok {
		return e.ExitCode()
	}
	return -1
}

// listDir is the sorted names in dir, space-separated.
func listDir(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return strings.Join(names, " ")
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(strings.ReplaceAll(string(b), " ", "_"))
}
