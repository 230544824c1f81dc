package atomicfile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDirectorySyncedAfterRename records the directory syncs of write: each
// happens after the rename (the new name is already in place) and names the
// file's own directory.
func TestDirectorySyncedAfterRename(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "sub"), 0o700))
	root, err := os.OpenRoot(dir)
	require.NoError(t, err)
	t.Cleanup(func() { root.Close() })
	var synced []string
	rec := func(r *os.Root, d string) error {
		b, err := r.ReadFile(filepath.Join(d, "agent.crt"))
		require.NoError(t, err, "synced before the rename")
		require.Equal(t, "cert", string(b))
		synced = append(synced, d)
		return SyncDir(r, d)
	}
	require.NoError(t, write(root, "agent.crt", []byte("cert"), 0o644, rec))
	require.NoError(t, write(root, "sub/agent.crt", []byte("cert"), 0o644, rec))
	require.Equal(t, []string{".", "sub"}, synced)

	// A failing directory sync fails the write.
	err = write(root, "agent.crt", []byte("cert"), 0o644, func(*os.Root, string) error { return os.ErrPermission })
	require.ErrorIs(t, err, os.ErrPermission)
	require.Error(t, SyncDir(root, "missing"))
}

func TestRemovePath(t *testing.T) {
	p := filepath.Join(t.TempDir(), "nonce.jwt")
	require.NoError(t, os.WriteFile(p, []byte("x"), 0o600))
	require.NoError(t, RemovePath(p))
	_, err := os.Stat(p)
	require.ErrorIs(t, err, os.ErrNotExist)
	require.NoError(t, RemovePath(p), "a missing file is not an error")
}
