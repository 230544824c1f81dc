package main

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// buildBinary compiles dev-s3 once per test binary run.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dev-s3")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, string(out))
	return bin
}

func TestBinary(t *testing.T) {
	bin := buildBinary(t)

	t.Run("serves, reads env, stops on SIGTERM", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "data")
		cmd := exec.Command(bin, "--log-level", "debug")
		cmd.Env = append(os.Environ(), "DEV_S3_ADDR=127.0.0.1:0", "DEV_S3_DIR="+dir, "DEV_S3_BUCKET=envbucket")
		stderr, err := cmd.StderrPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

		lines := make(chan string, 100)
		go func() {
			sc := bufio.NewScanner(stderr)
			for sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
		}()
		addrRe := regexp.MustCompile(`"addr": "([0-9.:]+)"`)
		var addr string
		var seen []string
		for addr == "" {
			select {
			case l, ok := <-lines:
				require.True(t, ok, "dev-s3 exited early: %v", seen)
				seen = append(seen, l)
				if m := addrRe.FindStringSubmatch(l); m != nil {
					addr = m[1]
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("no serving line from dev-s3: %v", seen)
			}
		}
		resp, err := http.Get("http://" + addr + "/healthz")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)

		req, err := http.NewRequest(http.MethodPut, "http://"+addr+"/envbucket/cluster/ca.crt", strings.NewReader("PEM"))
		require.NoError(t, err)
		resp, err = http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		data, err := os.ReadFile(filepath.Join(dir, "cluster", "ca.crt"))
		require.NoError(t, err)
		require.Equal(t, "PEM", string(data))

		require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
		var rest []string
		for l := range lines {
			rest = append(rest, l)
		}
		require.NoError(t, cmd.Wait(), "graceful stop exits 0")
		all := strings.Join(rest, "\n")
		require.Contains(t, all, "dev-s3 stopped")
		require.Contains(t, all, `"op": "PutObject"`, "debug level logs requests")
	})

	t.Run("unusable directory is a clear start-up error", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "file")
		require.NoError(t, os.WriteFile(file, nil, 0o644))
		cmd := exec.Command(bin, "--addr", "127.0.0.1:0", "--dir", filepath.Join(file, "sub"))
		stderr, err := cmd.StderrPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		msg, _ := io.ReadAll(stderr)
		err = cmd.Wait()
		require.Error(t, err)
		require.Contains(t, string(msg), "create bucket directory")
	})

	t.Run("bad log level", func(t *testing.T) {
		out, err := exec.Command(bin, "--log-level", "loud", "--dir", t.TempDir()).CombinedOutput()
		require.Error(t, err)
		require.Contains(t, string(out), "log level")
	})
}
