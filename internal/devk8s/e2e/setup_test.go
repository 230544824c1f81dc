package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nstance-dev/nstance/internal/devk8s/app"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

// devServer is a dev-k8s started for one test.
type devServer struct {
	dir        string
	kubeconfig string
	url        string
	config     *rest.Config
}

func startDev(t *testing.T, tls bool, crdPaths ...string) *devServer {
	t.Helper()
	dir := t.TempDir()
	return startDevIn(t, dir, tls, crdPaths...)
}

func startDevIn(t *testing.T, dir string, tls bool, crdPaths ...string) *devServer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d, wait := launch(t, ctx, dir, tls, crdPaths...)
	t.Cleanup(func() {
		cancel()
		require.NoError(t, wait())
	})
	return d
}

func launch(t *testing.T, ctx context.Context, dir string, tls bool, crdPaths ...string) (*devServer, func() error) {
	t.Helper()
	kc := filepath.Join(dir, "kubeconfig")
	run, err := app.Start(ctx, logr.Discard(), app.Config{
		Addr: "127.0.0.1:0", Dir: filepath.Join(dir, "data"), TLS: tls, KubeconfigOut: kc,
		CRDPaths: crdPaths, Controllers: true,
	})
	require.NoError(t, err)
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	require.NoError(t, err)
	require.Equal(t, run.AdminToken, readToken(t, run.Kubeconfig), "the data directory's kubeconfig carries the admin token")
	if !tls {
		// client-go takes credentials from a kubeconfig only for TLS
		// servers; over plain HTTP the token is set explicitly.
		cfg.BearerToken = run.AdminToken
	}
	cfg.ContentType = "application/json"
	return &devServer{dir: filepath.Join(dir, "data"), kubeconfig: kc, url: run.URL, config: cfg}, run.Wait
}

// readToken returns the bearer token of a kubeconfig's current user.
func readToken(t *testing.T, path string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(path)
	require.NoError(t, err)
	ctx := cfg.Contexts[cfg.CurrentContext]
	require.NotNil(t, ctx, "current context of %s", path)
	return cfg.AuthInfos[ctx.AuthInfo].Token
}

// kubectl runs the envtest-built kubectl against the server.
func (d *devServer) kubectl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	assets, err := kubetest.AssetsDir()
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(assets, "kubectl"), args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+d.kubeconfig)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err = cmd.Run()
	return out.String(), err
}

func (d *devServer) mustKubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := d.kubectl(t, args...)
	require.NoError(t, err, "kubectl %s: %s", strings.Join(args, " "), out)
	return out
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	return p
}
