package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// snapshot records every file under dir with its content.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[p] = string(data)
		} else {
			out[p] = info.Mode().Type().String()
		}
		return nil
	}))
	return out
}

const cmJSON = `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"%s"},"data":{"secret":"outside"}}`

// TestConfinedToDataDir checks that symlinks and unsafe names placed in the
// data directory by hand, or sent through Mutate, neither expose nor change
// files outside it.
func TestConfinedToDataDir(t *testing.T) {
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	dir := filepath.Join(base, "data")
	require.NoError(t, os.MkdirAll(filepath.Join(outside, "ns"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(outside, "leak.json"), []byte(fmt.Sprintf(cmJSON, "leak")), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(outside, "ns", "leak.json"), []byte(fmt.Sprintf(cmJSON, "leak")), 0o644))
	before := snapshot(t, outside)

	// Present at start: a symlinked namespace directory, symlinked object
	// files (absolute and relative), an invalid name.
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "configmaps", "default"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "nodes"), 0o755))
	require.NoError(t, os.Symlink(filepath.Join(outside, "ns"), filepath.Join(dir, "configmaps", "evil")))
	require.NoError(t, os.Symlink(filepath.Join(outside, "leak.json"), filepath.Join(dir, "configmaps", "default", "abs.json")))
	require.NoError(t, os.Symlink("../../../outside/leak.json", filepath.Join(dir, "configmaps", "default", "rel.json")))
	require.NoError(t, os.Symlink(filepath.Join(outside, "leak.json"), filepath.Join(dir, "nodes", "n1.json")))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "configmaps", "default", "Upper.json"), []byte(fmt.Sprintf(cmJSON, "Upper")), 0o644))

	upper := errors.New("upper case")
	s := openStore(t, dir, Options{ValidName: func(_, ns, name string) error {
		if strings.ToLower(ns+name) != ns+name {
			return upper
		}
		return nil
	}})
	entries, _ := s.List("configmaps", "")
	require.Empty(t, entries, "nothing behind a symlink or with an invalid name is loaded")
	nodes, _ := s.List("nodes", "")
	require.Empty(t, nodes)

	start, err := s.Watch("configmaps", "", s.CurrentRV(), false)
	require.NoError(t, err)
	w := start.Watcher

	// Made while running: the same tricks, then a plain file whose event
	// comes after theirs.
	require.NoError(t, os.Symlink(filepath.Join(outside, "ns"), filepath.Join(dir, "configmaps", "evil2")))
	require.NoError(t, os.Symlink(filepath.Join(outside, "leak.json"), filepath.Join(dir, "configmaps", "default", "late.json")))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "configmaps", "default", "Late.json"), []byte(fmt.Sprintf(cmJSON, "Late")), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "configmaps", "default", "ok.json"), []byte(fmt.Sprintf(cmJSON, "ok")), 0o644))
	ev := nextEvent(t, w)
	require.Equal(t, "ok", ev.Name, "the first event is the plain file's")
	noEvent(t, w, 200*time.Millisecond)

	// Unsafe names through the API are refused before touching a file.
	for _, c := range []struct{ ns, name string }{
		{"..", "x"}, {".", "x"}, {"default", ".."}, {"default", "a/b"}, {"a/b", "x"}, {"default", "a%2Fb"},
		{"default", ".hidden"}, {"default", strings.Repeat("a", 251)}, {"default", ""},
	} {
		_, err := s.Mutate("configmaps", c.ns, c.name, func(map[string]any) (Mutation, error) {
			return Mutation{Object: map[string]any{"metadata": map[string]any{"name": c.name}}}, nil
		})
		require.ErrorIs(t, err, ErrInvalidName, "%q/%q", c.ns, c.name)
	}
	// A write into the symlinked namespace directory fails in the root.
	_, err = s.Mutate("configmaps", "evil", "x", func(map[string]any) (Mutation, error) {
		return Mutation{Object: map[string]any{"metadata": map[string]any{"name": "x", "namespace": "evil"}}}, nil
	})
	require.Error(t, err)
	// So does deleting an object whose file became a symlink.
	require.NoError(t, os.Remove(filepath.Join(dir, "configmaps", "default", "ok.json")))
	require.Equal(t, "DELETED", string(nextEvent(t, w).Type))

	require.Equal(t, before, snapshot(t, outside), "files outside the data directory are unchanged")
	_, err = os.Stat(filepath.Join(base, "x.json"))
	require.ErrorIs(t, err, os.ErrNotExist)
}
