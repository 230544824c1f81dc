package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
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
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nstance-dev/nstance/internal/testing/bindtest"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dev-k8s")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

// proc is a running dev-k8s.
type proc struct {
	cmd    *exec.Cmd
	url    string
	port   int
	usage  string
	stderr chan string
}

var servingRE = regexp.MustCompile(`^dev-k8s is serving (https?://[0-9.]+:([0-9]+))$`)

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
	usage := make(chan []string, 1)
	go func() {
		var lines []string
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines = append(lines, sc.Text())
			if len(lines) == 3 {
				usage <- lines
			}
		}
		if len(lines) < 3 {
			usage <- lines
		}
	}()
	select {
	case lines := <-usage:
		if len(lines) < 3 {
			_ = cmd.Wait()
			var errs []string
			for l := range p.stderr {
				errs = append(errs, l)
			}
			return nil, fmt.Errorf("dev-k8s did not start: %q %s", lines, strings.Join(errs, "\n"))
		}
		m := servingRE.FindStringSubmatch(lines[0])
		require.NotNil(t, m, "first line: %q", lines[0])
		p.url = m[1]
		p.port, _ = strconv.Atoi(m[2])
		p.usage = strings.Join(lines, "\n")
	case <-time.After(60 * time.Second):
		t.Fatal("no start-up lines from dev-k8s within 60s")
	}
	return p, nil
}

func start(t *testing.T, bin string, env []string, args ...string) *proc {
	t.Helper()
	p, err := tryStart(t, bin, env, args...)
	require.NoError(t, err)
	return p
}

func (p *proc) stop(t *testing.T) string {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	var lines []string
	for l := range p.stderr {
		lines = append(lines, l)
	}
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		require.NoError(t, err, "clean exit on SIGTERM")
	case <-time.After(15 * time.Second):
		t.Fatal("dev-k8s did not stop on SIGTERM")
	}
	return strings.Join(lines, "\n")
}

// TestBinary runs dev-k8s with each transport, checks /healthz (anonymous,
// as on kube-apiserver) and the start-up output, and stops it with SIGTERM.
func TestBinary(t *testing.T) {
	bin := buildBinary(t)
	for _, tc := range []struct{ name, tls string }{{"https", "true"}, {"http", "false"}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "data")
			extra := filepath.Join(t.TempDir(), "extra", "kubeconfig")
			env := []string{"DEV_K8S_TLS=" + tc.tls, "DEV_K8S_DIR=" + dir, "DEV_K8S_ADDR=127.0.0.1:0",
				"DEV_K8S_KUBECONFIG_OUT=" + extra, "DEV_K8S_LOG_FORMAT=json"}
			// A client CA file that does not exist yet is waited for.
			caFile := filepath.Join(t.TempDir(), "later", "node-ca.crt")
			if tc.tls == "true" {
				env = append(env, "DEV_K8S_CLIENT_CA_FILE="+caFile)
			}
			p := start(t, bin, env)
			kc := filepath.Join(dir, "kubeconfig")
			require.Contains(t, p.usage, "export KUBECONFIG="+kc)
			if tc.tls == "true" {
				require.Contains(t, p.usage, "authentication: admin token, service account tokens, x509 client certificates (CA file "+caFile+")")
			} else {
				require.Contains(t, p.usage, "authentication: admin token, service account tokens\n")
			}
			for _, path := range []string{kc, extra} {
				cfg, err := clientcmd.BuildConfigFromFlags("", path)
				require.NoError(t, err)
				require.Equal(t, p.url, cfg.Host)
			}
			cfg, err := clientcmd.BuildConfigFromFlags("", kc)
			require.NoError(t, err)
			hc, err := rest.HTTPClientFor(rest.AnonymousClientConfig(cfg))
			require.NoError(t, err)
			res, err := hc.Get(cfg.Host + "/healthz")
			require.NoError(t, err)
			res.Body.Close()
			require.Equal(t, http.StatusOK, res.StatusCode)
			logs := p.stop(t)
			// The binary's version: "dev", or the module version go build
			// records from the VCS (internal/version).
			require.Regexp(t, `"msg":"starting","binary":"dev-k8s","version":"[^"]+"`, logs)
		})
	}

	for _, tc := range []struct {
		name, want string
		args       []string
	}{
		{name: "missing CRD path", args: []string{"--crd-dir", "/nonexistent/crds"}, want: "CRD path"},
		{name: "missing token file", args: []string{"--token-file", "/nonexistent/tokens.csv"}, want: "token file"},
		{name: "bad log format", args: []string{"--log-format", "xml"}, want: "log format"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := exec.Command(bin, append([]string{"--addr", "127.0.0.1:0", "--dir", t.TempDir()}, tc.args...)...).CombinedOutput()
			require.Error(t, err)
			require.Contains(t, string(out), tc.want)
		})
	}
	t.Run("malformed token file", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "tokens.csv")
		require.NoError(t, os.WriteFile(f, []byte("only,two\n"), 0o600))
		out, err := exec.Command(bin, "--addr", "127.0.0.1:0", "--dir", t.TempDir(), "--token-file", f).CombinedOutput()
		require.Error(t, err)
		require.Contains(t, string(out), "at least 3 columns")
	})
}

// status is the Status body of a refused request.
type status struct {
	Kind, Reason string
	Code         int
}

func get(t *testing.T, hc *http.Client, url, token string) (int, status) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := hc.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	var st status
	_ = json.Unmarshal(body, &st)
	return res.StatusCode, st
}

// TestAuthentication is the scripted acceptance of token authentication:
// no token and a wrong token get 401, kubectl with the written kubeconfig
// works, extra users come from --token-file, ServiceAccount tokens issued
// by dev-k8s work, and a restart on the same directory keeps the token.
func TestAuthentication(t *testing.T) {
	assets, err := kubetest.AssetsDir()
	require.NoError(t, err)
	kubectlBin := filepath.Join(assets, "kubectl")
	bin := buildBinary(t)
	dir := t.TempDir()
	tokens := filepath.Join(t.TempDir(), "tokens.csv")
	require.NoError(t, os.WriteFile(tokens, []byte(`alice-token,alice,alice-uid,"devs,admins"`+"\n"), 0o600))
	args := []string{"--addr", "127.0.0.1:0", "--dir", dir}
	p := start(t, bin, []string{"DEV_K8S_TOKEN_FILE=" + tokens}, args...)
	kc := filepath.Join(dir, "kubeconfig")
	info, err := os.Stat(kc)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	require.NoError(t, err)
	require.NotEmpty(t, cfg.BearerToken)
	anon, err := rest.HTTPClientFor(rest.AnonymousClientConfig(cfg))
	require.NoError(t, err)

	for _, tc := range []struct{ name, token string }{{"no token", ""}, {"wrong token", "not-the-token"}, {"admin token with a typo", cfg.BearerToken + "x"}} {
		code, st := get(t, anon, p.url+"/api/v1/namespaces", tc.token)
		require.Equal(t, http.StatusUnauthorized, code, tc.name)
		require.Equal(t, status{Kind: "Status", Reason: "Unauthorized", Code: 401}, st, tc.name)
	}
	code, _ := get(t, anon, p.url+"/api/v1/namespaces", cfg.BearerToken)
	require.Equal(t, http.StatusOK, code)

	kubectl := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, kubectlBin, args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+kc)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.String(), err
	}
	must := func(args ...string) string {
		out, err := kubectl(args...)
		require.NoError(t, err, "kubectl %s: %s", strings.Join(args, " "), out)
		return out
	}
	out := must("get", "ns")
	require.Contains(t, out, "default")
	require.Contains(t, out, "kube-system")
	require.Contains(t, must("auth", "whoami"), "dev-k8s-admin")
	out, err = kubectl("get", "ns", "--token", "wrong")
	require.Error(t, err)
	require.Contains(t, out, "Unauthorized")

	// An extra user from the token file.
	out = must("auth", "whoami", "--token", "alice-token")
	require.Contains(t, out, "alice")
	require.Contains(t, out, "[devs admins system:authenticated]")

	// A ServiceAccount token issued by dev-k8s authenticates as the
	// account until the account is deleted.
	must("create", "serviceaccount", "robot")
	saToken := strings.TrimSpace(must("create", "token", "robot"))
	require.Contains(t, must("auth", "whoami", "--token", saToken), "system:serviceaccount:default:robot")
	must("delete", "serviceaccount", "robot")
	out, err = kubectl("auth", "whoami", "--token", saToken)
	require.Error(t, err)
	require.Contains(t, out, "Unauthorized")

	// A restart on the same directory keeps the token and the kubeconfig.
	p.stop(t)
	p = start(t, bin, nil, args...)
	again, err := clientcmd.BuildConfigFromFlags("", kc)
	require.NoError(t, err)
	require.Equal(t, cfg.BearerToken, again.BearerToken)
	require.Contains(t, must("get", "ns"), "kube-system")
	out, err = kubectl("auth", "whoami", "--token", "alice-token")
	require.Error(t, err, "without --token-file alice is unknown")
	require.Contains(t, out, "Unauthorized")
	p.stop(t)
}

// TestLoopbackByDefault starts dev-k8s without --addr and checks that the
// machine's other addresses do not reach it; with --addr 0.0.0.0:<port>
// they do (so the check can see an exposed server).
func TestLoopbackByDefault(t *testing.T) {
	bin := buildBinary(t)
	out, err := exec.Command(bin, "--help").CombinedOutput()
	require.NoError(t, err)
	require.Contains(t, string(out), `(default: "127.0.0.1:6443")`)

	// The real default when its port is free; otherwise the default host on
	// a free port (another dev-k8s, e.g. the dev stack, may hold 6443).
	p, err := tryStart(t, bin, nil, "--dir", t.TempDir())
	if err != nil {
		require.Contains(t, err.Error(), "address already in use")
		t.Logf("127.0.0.1:6443 is taken; using 127.0.0.1:0: %v", err)
		p = start(t, bin, nil, "--dir", t.TempDir(), "--addr", "127.0.0.1:0")
	}
	bindtest.RequireLoopbackOnly(t, p.cmd.Process.Pid, p.port)
	p.stop(t)

	wide := start(t, bin, nil, "--dir", t.TempDir(), "--addr", "0.0.0.0:0")
	n := bindtest.RequireReachable(t, wide.port)
	t.Logf("--addr 0.0.0.0: reachable through %d non-loopback address(es)", n)
	wide.stop(t)
}
