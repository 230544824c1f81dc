package app

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCRDFiles(t *testing.T) {
	dir := t.TempDir()
	for _, n := range []string{"b.yaml", "a.yml", "c.json", "notes.txt"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), nil, 0o644))
	}
	require.NoError(t, os.Mkdir(filepath.Join(dir, "nested.yaml"), 0o755))
	single := filepath.Join(dir, "notes.txt")

	cases := []struct {
		name    string
		paths   []string
		want    []string
		wantErr bool
	}{
		{name: "directory", paths: []string{dir}, want: []string{filepath.Join(dir, "a.yml"), filepath.Join(dir, "b.yaml"), filepath.Join(dir, "c.json")}},
		{name: "file", paths: []string{single}, want: []string{single}},
		{name: "missing", paths: []string{filepath.Join(dir, "nope")}, wantErr: true},
		{name: "none", paths: nil, want: nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := crdFiles(tc.paths)
			if tc.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}
