package store

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func requireMode(t *testing.T, p string, want fs.FileMode) {
	t.Helper()
	fi, err := os.Lstat(p)
	require.NoError(t, err)
	require.Equal(t, want, fi.Mode().Perm(), "mode of %s", p)
}

// TestObjectFilesOwnerOnly checks that objects (Secrets among them) are
// written 0600 in 0700 directories, whatever the umask allows.
func TestObjectFilesOwnerOnly(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	s := openStore(t, dir, Options{})
	require.NoError(t, s.Register("secrets", true))
	_, err := s.Mutate("secrets", "default", "operator-key", func(map[string]any) (Mutation, error) {
		return Mutation{Object: map[string]any{"apiVersion": "v1", "kind": "Secret",
			"metadata": map[string]any{"name": "operator-key", "namespace": "default"}, "data": map[string]any{"tls.key": "UFJJVkFURQ=="}}}, nil
	})
	require.NoError(t, err)
	put(t, s, "nodes", "", "n1", nil)
	for _, d := range []string{dir, filepath.Join(dir, "secrets"), filepath.Join(dir, "secrets", "default"), filepath.Join(dir, "nodes"),
		filepath.Join(dir, StateDirName), filepath.Join(dir, StateDirName, "tmp")} {
		requireMode(t, d, 0o700)
	}
	for _, f := range []string{filepath.Join(dir, "secrets", "default", "operator-key.json"), filepath.Join(dir, "nodes", "n1.json"),
		filepath.Join(dir, StateDirName, stateFileName)} {
		requireMode(t, f, 0o600)
	}
}

// TestOpenTightensModes checks that files and directories left readable by
// others (by an older dev-k8s, a script or an editor) lose group and other
// permissions at start, and that symlinks and their targets are left alone.
func TestOpenTightensModes(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "data")
	outside := filepath.Join(base, "outside.json")
	require.NoError(t, os.WriteFile(outside, []byte(`{}`), 0o644))
	require.NoError(t, os.Chmod(outside, 0o644))
	secretDir := filepath.Join(dir, "secrets", "default")
	require.NoError(t, os.MkdirAll(secretDir, 0o755))
	for _, d := range []string{dir, filepath.Join(dir, "secrets"), secretDir} {
		require.NoError(t, os.Chmod(d, 0o755))
	}
	secret := filepath.Join(secretDir, "old.json")
	require.NoError(t, os.WriteFile(secret, []byte(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"old","namespace":"default"}}`), 0o644))
	require.NoError(t, os.Chmod(secret, 0o664))
	exe := filepath.Join(dir, "notes.sh")
	require.NoError(t, os.WriteFile(exe, []byte("#!/bin/sh\n"), 0o755))
	require.NoError(t, os.Chmod(exe, 0o755))
	require.NoError(t, os.Symlink(outside, filepath.Join(secretDir, "link.json")))

	s := openStore(t, dir, Options{})
	require.NoError(t, s.Register("secrets", true))
	for _, d := range []string{dir, filepath.Join(dir, "secrets"), secretDir} {
		requireMode(t, d, 0o700)
	}
	requireMode(t, secret, 0o600)
	requireMode(t, exe, 0o700)
	requireMode(t, outside, 0o644)
	_, ok := s.Get("secrets", "default", "old")
	require.True(t, ok, "the tightened Secret is still served")
}
