package hollownode

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/clientcmd"
)

func TestKubeconfigFromFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "kubeconfig")
	opts := Options{Name: "n1", Server: "https://127.0.0.1:6443"}
	opts.CAFile, opts.CertFile, opts.KeyFile = filepath.Join(dir, "ca.crt"), filepath.Join(dir, "n1.crt"), filepath.Join(dir, "n1.key")
	for _, f := range []string{opts.CAFile, opts.CertFile, opts.KeyFile} {
		require.NoError(t, os.WriteFile(f, nil, 0o600)) // read by BuildConfigFromFlags only for existence
	}
	require.NoError(t, writeKubeconfig(path, opts))
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	require.NoError(t, err)
	require.Equal(t, opts.Server, cfg.Host)
	require.Equal(t, opts.CAFile, cfg.CAFile)
	require.Equal(t, opts.CertFile, cfg.CertFile)
	require.Equal(t, opts.KeyFile, cfg.KeyFile)

	err = writeKubeconfig(filepath.Join(dir, "other"), Options{Name: "n1", Server: "https://127.0.0.1:6443"})
	require.ErrorContains(t, err, "without Kubeconfig, CAFile, CertFile, KeyFile must be set")
}

func TestRuntimeSocketLine(t *testing.T) {
	line := `I1127 00:23:30.671602   23123 remote_runtime.go:97] "Connecting to runtime service" endpoint="unix:///tmp/kubelet_remote_2262651461725920083.sock"`
	m := runtimeLine.FindStringSubmatch(line)
	require.NotNil(t, m)
	require.Equal(t, "/tmp/kubelet_remote_2262651461725920083.sock", m[1])
	require.Nil(t, runtimeLine.FindStringSubmatch(`"Connecting to runtime service" endpoint="unix:///run/containerd/containerd.sock"`))
}

func TestRootDirLine(t *testing.T) {
	line := `I1127 00:23:14.386807   22774 hollow_kubelet.go:150] Using /tmp/hollow-kubelet.1323444418 as root dir for hollow-kubelet`
	m := rootDirLine.FindStringSubmatch(line)
	require.NotNil(t, m)
	require.Equal(t, "/tmp/hollow-kubelet.1323444418", m[1])
	require.Nil(t, rootDirLine.FindStringSubmatch("Using /tmp/hollow-kubelet.1/../x as root dir"))
}

func TestBinaryMissingSaysHowToBuild(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("KUBEBUILDER_ASSETS", dir)
	_, err := Binary()
	require.Error(t, err)
	for _, want := range []string{dir, "scripts/envtest-assets.sh", "C compiler"} {
		require.True(t, strings.Contains(err.Error(), want), "error %q lacks %q", err, want)
	}
	bin := filepath.Join(dir, "kubemark")
	require.NoError(t, os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755))
	got, err := Binary()
	require.NoError(t, err)
	require.Equal(t, bin, got)
}

func TestStartNeedsAName(t *testing.T) {
	_, err := start(t, Options{})
	require.ErrorContains(t, err, "Name is required")
}

// A kubemark that exits at once fails Start with its output, and leaves
// nothing running.
func TestStartReportsEarlyExit(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "kubemark")
	require.NoError(t, os.WriteFile(bin, []byte("#!/bin/sh\necho \"fake kubemark: bad flag $1\" >&2\nexit 3\n"), 0o755))
	_, err := start(t, Options{Name: "n1", Binary: bin, Kubeconfig: filepath.Join(dir, "kubeconfig")})
	require.Error(t, err)
	require.ErrorContains(t, err, "exit status 3")
	require.ErrorContains(t, err, "fake kubemark: bad flag --morph=kubelet")
}
