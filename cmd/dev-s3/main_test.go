package main

import (
	"bufio"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/testing/bindtest"
	"github.com/nstance-dev/nstance/internal/testing/hosttools"
)

// buildBinary compiles dev-s3 once per test.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dev-s3")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, string(out))
	return bin
}

// proc is a running dev-s3.
type proc struct {
	cmd      *exec.Cmd
	endpoint string
	port     int
	stderr   chan string
}

var endpointRE = regexp.MustCompile(`at (http://[0-9.]+:([0-9]+))`)

// start runs bin and waits for its start-up line on stdout.
func start(t *testing.T, bin string, env []string, args ...string) *proc {
	t.Helper()
	p, err := tryStart(t, bin, env, args...)
	require.NoError(t, err)
	return p
}

func tryStart(t *testing.T, bin string, env []string, args ...string) (*proc, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	p := &proc{cmd: cmd, stderr: make(chan string, 1000)}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.stderr <- sc.Text()
		}
		close(p.stderr)
	}()
	first := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case first <- sc.Text():
			default:
			}
		}
		close(first)
	}()
	select {
	case line, ok := <-first:
		m := endpointRE.FindStringSubmatch(line)
		if !ok || m == nil {
			_ = cmd.Wait()
			var errs []string
			for l := range p.stderr {
				errs = append(errs, l)
			}
			return nil, fmt.Errorf("dev-s3 did not start: %q %s", line, strings.Join(errs, "\n"))
		}
		p.endpoint = m[1]
		p.port, _ = strconv.Atoi(m[2])
	case <-time.After(30 * time.Second):
		t.Fatal("no start-up line from dev-s3 within 30s")
	}
	return p, nil
}

// stop sends SIGTERM and returns everything dev-s3 logged.
func (p *proc) stop(t *testing.T) string {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	var lines []string
	for l := range p.stderr {
		lines = append(lines, l)
	}
	require.NoError(t, p.cmd.Wait(), "graceful stop exits 0")
	return strings.Join(lines, "\n")
}

func TestBinary(t *testing.T) {
	bin := buildBinary(t)

	t.Run("serves, reads env, stops on SIGTERM", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "data")
		p := start(t, bin, []string{"DEV_S3_ADDR=127.0.0.1:0", "DEV_S3_DIR=" + dir, "DEV_S3_BUCKET=envbucket", "DEV_S3_LOG_LEVEL=debug", "DEV_S3_LOG_FORMAT=json"})
		resp, err := http.Get(p.endpoint + "/healthz")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)

		req, err := http.NewRequest(http.MethodPut, p.endpoint+"/envbucket/cluster/ca.crt", strings.NewReader("PEM"))
		require.NoError(t, err)
		resp, err = http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "no --access-key: unsigned requests work")
		data, err := os.ReadFile(filepath.Join(dir, "cluster", "ca.crt"))
		require.NoError(t, err)
		require.Equal(t, "PEM", string(data))

		all := p.stop(t)
		require.Regexp(t, `"msg":"starting","binary":"dev-s3","version":"[^"]+"`, all, "the version is logged first")
		require.Contains(t, all, "dev-s3 stopped")
		require.Contains(t, all, `"op":"PutObject"`, "debug level logs requests")
	})

	t.Run("credentials from the environment", func(t *testing.T) {
		p := start(t, bin, []string{"DEV_S3_ACCESS_KEY=ak", "DEV_S3_SECRET_KEY=sk"}, "--addr", "127.0.0.1:0", "--dir", t.TempDir())
		req, err := http.NewRequest(http.MethodPut, p.endpoint+"/dev/x", strings.NewReader("x"))
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusForbidden, resp.StatusCode)
		require.Contains(t, string(body), "AccessDenied")
		p.stop(t)
	})

	for _, tc := range []struct {
		name, want string
		args       []string
		env        []string
	}{
		{name: "unusable directory", args: []string{"--dir", filepath.Join(os.Args[0], "sub")}, want: "bucket directory"},
		{name: "bad log level", args: []string{"--log-level", "loud"}, want: "log level"},
		{name: "bad upload expiry", env: []string{"DEV_S3_UPLOAD_EXPIRY=-1h"}, want: "--upload-expiry must be positive"},
		{name: "access key without secret", args: []string{"--access-key", "ak"}, want: "both an access key and a secret key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(bin, append([]string{"--addr", "127.0.0.1:0", "--dir", t.TempDir()}, tc.args...)...)
			cmd.Env = append(os.Environ(), tc.env...)
			out, err := cmd.CombinedOutput()
			require.Error(t, err)
			require.Contains(t, string(out), tc.want)
		})
	}
}

// TestLoopbackByDefault starts dev-s3 without --addr and checks that the
// machine's other addresses do not reach it; with --addr 0.0.0.0:<port>
// they do (so the check can see an exposed server).
func TestLoopbackByDefault(t *testing.T) {
	bin := buildBinary(t)
	out, err := exec.Command(bin, "--help").CombinedOutput()
	require.NoError(t, err)
	require.Contains(t, string(out), `(default: "127.0.0.1:8989")`)

	// The real default when its port is free; otherwise the default host on
	// a free port (another dev-s3, e.g. the dev stack, may hold 8989).
	p, err := tryStart(t, bin, nil, "--dir", t.TempDir())
	if err != nil {
		require.Contains(t, err.Error(), "address already in use")
		t.Logf("127.0.0.1:8989 is taken; using 127.0.0.1:0: %v", err)
		p = start(t, bin, nil, "--dir", t.TempDir(), "--addr", "127.0.0.1:0")
	}
	bindtest.RequireLoopbackOnly(t, p.cmd.Process.Pid, p.port)
	p.stop(t)

	wide := start(t, bin, nil, "--dir", t.TempDir(), "--addr", "0.0.0.0:0")
	n := bindtest.RequireReachable(t, wide.port)
	t.Logf("--addr 0.0.0.0: reachable through %d non-loopback address(es)", n)
	wide.stop(t)
}

// TestMultipartUploadMemory uploads 200 MiB through the aws CLI (multipart,
// 8 MiB parts, ten at a time) and checks dev-s3's peak resident memory.
func TestMultipartUploadMemory(t *testing.T) {
	awsBin := hosttools.Require(t, "aws")
	bin := buildBinary(t)
	dir := t.TempDir()
	p := start(t, bin, nil, "--addr", "127.0.0.1:0", "--dir", dir, "--access-key", "ak", "--secret-key", "sk", "--log-level", "debug")

	const size = 200 << 20
	src := filepath.Join(t.TempDir(), "big.bin")
	f, err := os.Create(src)
	require.NoError(t, err)
	_, err = io.CopyN(f, rand.Reader, size)
	require.NoError(t, err)
	require.NoError(t, f.Close())

	home := t.TempDir()
	cmd := exec.Command(awsBin, "s3", "cp", "--no-progress", src, "s3://dev/big.bin", "--endpoint-url", p.endpoint)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "AWS_CONFIG_FILE=" + filepath.Join(home, "config"),
		"AWS_SHARED_CREDENTIALS_FILE=" + filepath.Join(home, "credentials"), "AWS_ACCESS_KEY_ID=ak", "AWS_SECRET_ACCESS_KEY=sk",
		"AWS_DEFAULT_REGION=us-east-1", "PYENV_ROOT=" + os.Getenv("PYENV_ROOT"), "PYENV_VERSION=" + os.Getenv("PYENV_VERSION")}
	if os.Getenv("PYENV_ROOT") == "" {
		if h, err := os.UserHomeDir(); err == nil {
			cmd.Env = append(cmd.Env, "PYENV_ROOT="+filepath.Join(h, ".pyenv"))
		}
	}
	start := time.Now()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	elapsed := time.Since(start)

	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	require.NoError(t, err)
	hwm := regexp.MustCompile(`VmHWM:\s+(\d+) kB`).FindSubmatch(status)
	require.NotNil(t, hwm, "%s", status)
	kb, _ := strconv.Atoi(string(hwm[1]))
	t.Logf("200 MiB multipart upload in %s; dev-s3 peak RSS (VmHWM) %.1f MiB", elapsed.Round(time.Millisecond), float64(kb)/1024)

	info, err := os.Stat(filepath.Join(dir, "big.bin"))
	require.NoError(t, err)
	require.Equal(t, int64(size), info.Size())
	same, err := exec.Command("cmp", src, filepath.Join(dir, "big.bin")).CombinedOutput()
	require.NoError(t, err, "stored object differs: %s", same)
	logs := p.stop(t)
	require.Contains(t, logs, "CompleteMultipartUpload", "the upload went multipart")
	require.Less(t, kb, 100*1024, "dev-s3 peak RSS %d KiB during a 200 MiB multipart upload", kb)
}
