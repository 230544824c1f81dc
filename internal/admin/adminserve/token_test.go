package adminserve_test

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/admin/adminserve"
)

func TestTokenCreatedOnceWithMode0600(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nstance", adminserve.TokenFileName)
	tok, created, err := adminserve.LoadOrCreateToken(path)
	require.NoError(t, err)
	require.True(t, created)
	require.Len(t, tok, 43, "32 random bytes, base64url")
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	dir, err := os.Stat(filepath.Dir(path))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), dir.Mode().Perm(), "a directory it creates is the owner's only")

	again, created, err := adminserve.LoadOrCreateToken(path)
	require.NoError(t, err)
	require.False(t, created)
	require.Equal(t, tok, again)
	entries, err := os.ReadDir(filepath.Dir(path))
	require.NoError(t, err)
	require.Len(t, entries, 1, "no temporary file is left behind")

	other, _, err := adminserve.LoadOrCreateToken(filepath.Join(t.TempDir(), adminserve.TokenFileName))
	require.NoError(t, err)
	require.NotEqual(t, tok, other)
}

func TestTokenFileRefused(t *testing.T) {
	good := "abcdefghijklmnopqrstuvwxyz0123456789-_AB"
	for name, c := range map[string]struct {
		content string
		mode    os.FileMode
		want    string
	}{
		"group readable":  {good, 0o640, "mode 0640"},
		"others readable": {good, 0o604, "mode 0604"},
		"group writable":  {good, 0o620, "mode 0620"},
		"short":           {"abc", 0o600, "at least 32"},
		"empty":           {"\n", 0o600, "at least 32"},
		"bad characters":  {good + ";x", 0o600, "may hold only"},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), adminserve.TokenFileName)
			require.NoError(t, os.WriteFile(path, []byte(c.content), 0o600))
			require.NoError(t, os.Chmod(path, c.mode))
			_, _, err := adminserve.LoadOrCreateToken(path)
			require.ErrorContains(t, err, c.want)
			require.ErrorContains(t, err, path, "the error names the file")
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			require.Equal(t, c.content, string(b), "a refused file is left as it is")
		})
	}
	t.Run("directory", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), adminserve.TokenFileName)
		require.NoError(t, os.Mkdir(path, 0o700))
		_, _, err := adminserve.LoadOrCreateToken(path)
		require.ErrorContains(t, err, "not a regular file")
	})
	t.Run("symlink", func(t *testing.T) {
		dir := t.TempDir()
		target := filepath.Join(dir, "real")
		require.NoError(t, os.WriteFile(target, []byte(good), 0o600))
		path := filepath.Join(dir, adminserve.TokenFileName)
		require.NoError(t, os.Symlink(target, path))
		_, _, err := adminserve.LoadOrCreateToken(path)
		require.ErrorContains(t, err, "not a regular file")
	})
}

// TestTokenConcurrentStarts: serves starting at once agree on one token.
func TestTokenConcurrentStarts(t *testing.T) {
	path := filepath.Join(t.TempDir(), adminserve.TokenFileName)
	const n = 8
	toks := make([]string, n)
	created := make([]bool, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			toks[i], created[i], errs[i] = adminserve.LoadOrCreateToken(path)
		}()
	}
	wg.Wait()
	nCreated := 0
	for i := range n {
		require.NoError(t, errs[i], "start %d", i)
		require.Equal(t, toks[0], toks[i])
		if created[i] {
			nCreated++
		}
	}
	require.Equal(t, 1, nCreated)
}
