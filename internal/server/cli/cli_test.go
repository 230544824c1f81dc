package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	ucli "github.com/urfave/cli/v2"
)

func TestValidateFlag(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonc")
	require.NoError(t, os.WriteFile(bad, []byte(`{"cluster": {"id": "c1", "colour": "blue"}}`), 0o600))
	tests := []struct {
		name    string
		args    []string
		wantOut string
		wantErr string
	}{
		{"example is valid", []string{"--shard", "dev-1", "--validate", "--config-file", "../../../examples/config-tmux.jsonc"}, "valid", ""},
		{"shard mismatch", []string{"--shard", "dev-2", "--validate", "--config-file", "../../../examples/config-tmux.jsonc"}, `shard.id: is "dev-1", but --shard is "dev-2"`, "1 problem"},
		{"unknown key", []string{"--shard", "dev-1", "--validate", "--config-file", bad}, "cluster.colour: unknown key", "1 problem"},
		{"missing file", []string{"--shard", "dev-1", "--validate", "--config-file", filepath.Join(dir, "nope")}, "", "reading"},
		{"config-file without validate", []string{"--shard", "dev-1", "--config-file", bad}, "", "only used with --validate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := App()
			var out bytes.Buffer
			a.Writer, a.ErrWriter = &out, &out
			a.ExitErrHandler = func(*ucli.Context, error) {} // keep the test process alive
			err := a.Run(append([]string{"nstance-server"}, tc.args...))
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			require.Contains(t, out.String(), tc.wantOut)
		})
	}
}
