package main

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"io"
	"net"
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

	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/internal/testing/syncbuf"
)

func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "nstance-admin")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, string(out))
	return bin
}

// connArgs starts a shard and returns the connection flags of an operator of it.
func connArgs(t *testing.T) []string {
	sh := shardtest.Start(t, shardtest.Options{ShardID: "dev-1"})
	dir := t.TempDir()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	_, certPEM, err := sh.CA.IssueClient(pki.ClientRequest{
		Identity:  pki.Identity{ClusterID: sh.ClusterID, Tenant: "default", Role: pki.RoleOperator, ClientID: "admin"},
		PublicKey: pub, Validity: time.Hour,
	}, time.Now())
	require.NoError(t, err)
	keyPEM, err := pki.MarshalPrivateKeyPEM(priv)
	require.NoError(t, err)
	for name, b := range map[string][]byte{"ca.crt": sh.CA.CertPEM, "op.crt": certPEM, "op.key": keyPEM} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o600))
	}
	return []string{"--servers", "dev-1=" + sh.OperatorAddr, "--ca-cert", filepath.Join(dir, "ca.crt"),
		"--cert", filepath.Join(dir, "op.crt"), "--key", filepath.Join(dir, "op.key")}
}

// start runs the binary with a private context file; lines carries its stderr.
func start(t *testing.T, bin string, stdout io.Writer, args ...string) (*exec.Cmd, <-chan string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "NSTANCE_ADMIN_CONFIG="+filepath.Join(t.TempDir(), "admin.yaml"))
	cmd.Stdout = stdout
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 1000)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	return cmd, lines
}

// await returns the first stderr line matching re, failing after 30s.
func await(t *testing.T, lines <-chan string, re *regexp.Regexp) []string {
	t.Helper()
	var seen []string
	for {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "nstance-admin exited early; stderr: %v", seen)
			seen = append(seen, l)
			if m := re.FindStringSubmatch(l); m != nil {
				return m
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no line matching %s; stderr: %v", re, seen)
		}
	}
}

// exitsZero waits for the process to end and requires exit code 0.
func exitsZero(t *testing.T, cmd *exec.Cmd, lines <-chan string) []string {
	t.Helper()
	var rest []string
	for l := range lines { // closed when the process closes stderr
		rest = append(rest, l)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "exit status; stderr: %v", rest)
	case <-time.After(30 * time.Second):
		t.Fatalf("nstance-admin did not exit; stderr: %v", rest)
	}
	return rest
}

func TestBinary(t *testing.T) {
	bin := buildBinary(t)
	conn := connArgs(t)

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run("serve stops cleanly on "+sig.String(), func(t *testing.T) {
			tokenFile := filepath.Join(t.TempDir(), "serve.token")
			var out syncbuf.Buffer
			cmd, lines := start(t, bin, &out, append([]string{"serve", "--listen", "127.0.0.1:0", "--log-format", "json", "--token-file", tokenFile}, conn...)...)
			m := await(t, lines, regexp.MustCompile(`"msg":"starting".*"version":"([^"]*)"`))
			require.NotEmpty(t, m[1])
			url := await(t, lines, regexp.MustCompile(`"msg":"serving the status page and the HTTP API".*"url":"http://([0-9.:]+)"`))[1]
			tok, err := os.ReadFile(tokenFile)
			require.NoError(t, err)
			// The new token is printed once, in the page's URL, on stdout
			// (copied from the pipe apart from stderr: wait for the line).
			require.Eventually(t, func() bool { return strings.Contains(out.String(), "?token=") }, 10*time.Second, 10*time.Millisecond)
			require.Equal(t, 1, strings.Count(out.String(), strings.TrimSpace(string(tok))), out.String())
			require.Contains(t, out.String(), "http://"+url+"/?token="+strings.TrimSpace(string(tok)))
			get := func(path string) *http.Response {
				req, err := http.NewRequest("GET", "http://"+url+path, nil)
				require.NoError(t, err)
				req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
				resp, err := http.DefaultClient.Do(req)
				require.NoError(t, err)
				return resp
			}
			resp := get("/v1/shards")
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
			// A status page left open (an event stream that never ends by
			// itself) must not hold the shutdown up.
			events := get("/v1/status/events")
			defer events.Body.Close()
			require.Equal(t, "text/event-stream", events.Header.Get("Content-Type"))

			require.NoError(t, syscall.Kill(cmd.Process.Pid, sig))
			rest := exitsZero(t, cmd, lines)
			require.Contains(t, rest[len(rest)-1], `"msg":"stopped"`)
			for _, l := range rest {
				require.NotContains(t, l, "did not finish in time", "the open event stream ended with the shutdown")
			}
			_, err = net.DialTimeout("tcp", url, time.Second)
			require.Error(t, err, "the port is closed")
		})
	}

	t.Run("a watch stops cleanly on SIGTERM", func(t *testing.T) {
		var out syncbuf.Buffer
		cmd, lines := start(t, bin, &out, append([]string{"group", "list", "--watch"}, conn...)...)
		require.Eventually(t, func() bool { return out.String() != "" }, 30*time.Second, 10*time.Millisecond)
		require.Equal(t, "EVENT     SHARD  GROUP  TEMPLATE  SIZE  ACTUAL  READY  STATIC\n", out.String())
		require.NoError(t, syscall.Kill(cmd.Process.Pid, syscall.SIGTERM))
		exitsZero(t, cmd, lines)
	})

	t.Run("-o bogus is refused", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, append([]string{"group", "list", "-o", "bogus"}, conn...)...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee)
		require.Equal(t, 1, ee.ExitCode())
		require.Empty(t, stdout.String())
		require.Equal(t, "nstance-admin: unknown output format \"bogus\": want one of table, json, yaml\n", stderr.String())
	})

	t.Run("logs never reach stdout", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(bin, append([]string{"group", "list", "-o", "json", "--log-level", "debug", "--log-format", "text"}, conn...)...)
		cmd.Env = append(os.Environ(), "NSTANCE_ADMIN_CONFIG="+filepath.Join(t.TempDir(), "admin.yaml"))
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		require.NoError(t, cmd.Run(), stderr.String())
		require.True(t, json.Valid(stdout.Bytes()), stdout.String())
		require.Contains(t, stderr.String(), "connecting")
	})
}
