package contextfile_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/admin/contextfile"
)

func TestSaveLoadRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "admin.yaml")
	f := &contextfile.File{}
	f.Upsert(contextfile.Context{Name: "prod", Servers: map[string]string{"eu-1": "10.0.0.1:8993"}, CACert: "/etc/ca.crt", Cert: "op.crt", Key: "op.key"})
	f.Upsert(contextfile.Context{Name: "dev", Servers: map[string]string{"dev-1": "127.0.0.1:8993", "dev-2": "127.0.0.1:9003"}})
	f.CurrentContext = "dev"
	require.NoError(t, f.Save(path))

	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	dst, err := os.Stat(filepath.Dir(path))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), dst.Mode().Perm())
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, `contexts:
- name: dev
  servers:
    dev-1: 127.0.0.1:8993
    dev-2: 127.0.0.1:9003
- ca-cert: /etc/ca.crt
  cert: op.crt
  key: op.key
  name: prod
  servers:
    eu-1: 10.0.0.1:8993
current-context: dev
`, string(b))

	got, err := contextfile.Load(path)
	require.NoError(t, err)
	require.Equal(t, f, got)
	cx, err := got.Current("")
	require.NoError(t, err)
	require.Equal(t, "dev", cx.Name)
	cx, err = got.Current("prod")
	require.NoError(t, err)
	require.Equal(t, filepath.Join(filepath.Dir(path), "op.crt"), contextfile.Resolve(path, cx.Cert), "relative paths are relative to the file")
	require.Equal(t, "/etc/ca.crt", contextfile.Resolve(path, cx.CACert))
	_, err = got.Current("nope")
	require.EqualError(t, err, `no context named "nope" (known: dev, prod)`)

	require.NoError(t, got.Delete("dev"))
	require.Empty(t, got.CurrentContext, "deleting the current context leaves none current")
	_, err = got.Current("")
	require.ErrorContains(t, err, "no current context")
}

func TestLoadRefusesBadFiles(t *testing.T) {
	dir := t.TempDir()
	_, err := contextfile.Load(filepath.Join(dir, "missing.yaml"))
	require.ErrorIs(t, err, contextfile.ErrNotExist)
	f, err := contextfile.LoadOrEmpty(filepath.Join(dir, "missing.yaml"))
	require.NoError(t, err)
	require.Empty(t, f.Contexts)

	for name, tc := range map[string]struct{ body, want string }{
		"not yaml":        {"contexts: [", "context file"},
		"unknown key":     {"contexts: []\ncurent-context: dev\n", `unknown field "curent-context"`},
		"unknown ctx key": {"contexts:\n- name: dev\n  server: {}\n", `unknown field "server"`},
		"duplicate key":   {"contexts: []\ncontexts: []\n", "contexts"},
		"duplicate name":  {"contexts:\n- name: a\n- name: a\n", `context "a" is defined twice`},
		"bad name":        {"contexts:\n- name: a/b\n", "only letters"},
		"bad server":      {"contexts:\n- name: a\n  servers: {dev-1: nope}\n", "shard dev-1"},
		"bad shard id":    {"contexts:\n- name: a\n  servers: {'Dev 1': '127.0.0.1:1'}\n", "shard id"},
		"bad current":     {"current-context: b\ncontexts:\n- name: a\n", `current-context "b" is not one of the contexts (a)`},
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, name+".yaml")
			require.NoError(t, os.WriteFile(path, []byte(tc.body), 0o600))
			_, err := contextfile.Load(path)
			require.ErrorContains(t, err, tc.want)
			require.ErrorContains(t, err, path, "the error names the file")
		})
	}
}
