package atomicfile_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/atomicfile"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	root, err := os.OpenRoot(dir)
	require.NoError(t, err)
	t.Cleanup(func() { root.Close() })

	cases := []struct {
		name    string
		rel     string
		data    string
		mode    os.FileMode
		wantErr bool
	}{
		{name: "new file", rel: "a.txt", data: "one", mode: 0o644},
		{name: "replace keeps only new content", rel: "a.txt", data: "two", mode: 0o600},
		{name: "nested", rel: "sub/b.txt", data: "three", mode: 0o640},
		{name: "escape refused by the root", rel: "../outside.txt", data: "x", mode: 0o644, wantErr: true},
		{name: "missing directory", rel: "nope/c.txt", data: "x", mode: 0o644, wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := atomicfile.Write(root, tc.rel, []byte(tc.data), tc.mode)
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			got, err := os.ReadFile(filepath.Join(dir, tc.rel))
			require.NoError(t, err)
			require.Equal(t, tc.data, string(got))
			fi, err := os.Stat(filepath.Join(dir, tc.rel))
			require.NoError(t, err)
			require.Equal(t, tc.mode, fi.Mode().Perm())
		})
	}
	_, err = os.Stat(filepath.Join(filepath.Dir(dir), "outside.txt"))
	require.ErrorIs(t, err, os.ErrNotExist)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		require.NotContains(t, e.Name(), ".tmp-", "no temporary file left behind")
	}
}

func TestWritePath(t *testing.T) {
	p := filepath.Join(t.TempDir(), "key.pem")
	require.NoError(t, atomicfile.WritePath(p, []byte("k"), 0o600))
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	require.Equal(t, "k", string(got))
}
