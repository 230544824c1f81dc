package toolbin

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// A tools module in a scratch repository is built once into the cache,
// under a name that follows its go.mod, and found there afterwards.
func TestBuildCachesByModuleHash(t *testing.T) {
	// A scratch tools cache; the Go build cache stays where it is (it
	// would follow XDG_CACHE_HOME and rebuild the standard library).
	gocache, err := exec.Command("go", "env", "GOCACHE").Output()
	require.NoError(t, err)
	t.Setenv("GOCACHE", strings.TrimSpace(string(gocache)))
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	root := t.TempDir()
	mod := filepath.Join(root, "scripts", "tools", "hello")
	require.NoError(t, os.MkdirAll(mod, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(mod, "go.mod"), []byte("module example.com/hello\n\ngo 1.26\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(mod, "go.sum"), nil, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(mod, "main.go"), []byte("package main\n\nfunc main() { println(\"hello\") }\n"), 0o644))
	tool := Tool{Name: "hello", Main: "example.com/hello"}

	p, ok, err := Cached(root, tool)
	require.NoError(t, err)
	require.False(t, ok)
	require.True(t, strings.HasPrefix(filepath.Base(p), "hello-"))

	// Two builds at once (test packages run in parallel): one builds, the
	// other waits and finds it.
	var wg sync.WaitGroup
	paths, errs := make([]string, 2), make([]error, 2)
	for i := range paths {
		wg.Go(func() { paths[i], errs[i] = Build(context.Background(), root, tool) })
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	require.Equal(t, filepath.Join(os.Getenv("XDG_CACHE_HOME"), "nstance", "tools"), filepath.Dir(p), "the cache follows XDG_CACHE_HOME")
	require.Equal(t, p, paths[0])
	require.Equal(t, p, paths[1])
	out, err := exec.Command(p).CombinedOutput()
	require.NoError(t, err)
	require.Equal(t, "hello\n", string(out))

	// Another pin is another build.
	require.NoError(t, os.WriteFile(filepath.Join(mod, "go.mod"), []byte("module example.com/hello\n\ngo 1.26.0\n"), 0o644))
	p2, ok, err := Cached(root, tool)
	require.NoError(t, err)
	require.False(t, ok)
	require.NotEqual(t, p, p2)

	_, err = Build(context.Background(), root, Tool{Name: "hello", Main: "example.com/nothing"})
	require.ErrorContains(t, err, "go build example.com/nothing")
}
