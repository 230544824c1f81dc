package main

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// TestBinary builds dev-k8s, runs it with each transport, checks /healthz
// through the written kubeconfig, and stops it with SIGTERM.
func TestBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "dev-k8s")
	build := exec.Command("go", "build", "-o", bin, ".")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	cases := []struct {
		name string
		tls  string
	}{
		{name: "https", tls: "true"},
		{name: "http", tls: "false"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			kc := filepath.Join(dir, "kubeconfig")
			cmd := exec.Command(bin, "--addr", "127.0.0.1:0", "--dir", filepath.Join(dir, "data"), "--tls="+tc.tls, "--kubeconfig-out", kc)
			cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
			require.NoError(t, cmd.Start())
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			t.Cleanup(func() {
				if cmd.ProcessState == nil {
					_ = cmd.Process.Kill()
				}
			})
			require.Eventually(t, func() bool { _, err := os.Stat(kc); return err == nil }, 20*time.Second, 50*time.Millisecond)
			cfg, err := clientcmd.BuildConfigFromFlags("", kc)
			require.NoError(t, err)
			hc, err := rest.HTTPClientFor(cfg)
			require.NoError(t, err)
			res, err := hc.Get(cfg.Host + "/healthz")
			require.NoError(t, err)
			res.Body.Close()
			require.Equal(t, http.StatusOK, res.StatusCode)

			require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
			select {
			case err := <-exited:
				require.NoError(t, err, "clean exit on SIGTERM")
			case <-time.After(10 * time.Second):
				t.Fatal("dev-k8s did not stop on SIGTERM")
			}
		})
	}

	t.Run("bad flag value", func(t *testing.T) {
		dir := t.TempDir()
		out, err := exec.Command(bin, "--addr", "127.0.0.1:0", "--dir", dir, "--crd-dir", filepath.Join(dir, "missing")).CombinedOutput()
		require.Error(t, err)
		require.Contains(t, string(out), "CRD path")
	})
}
