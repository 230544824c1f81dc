package conn_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"

	"github.com/nstance-dev/nstance/internal/admin/conn"
)

// resolve runs a command with the connection flags and returns what Resolve made of them.
func resolve(t *testing.T, args ...string) (conn.Settings, error) {
	t.Helper()
	var got conn.Settings
	var rerr error
	app := &cli.App{Name: "t", Commands: []*cli.Command{{
		Name: "x", Flags: conn.Flags(true),
		Action: func(c *cli.Context) error {
			got, rerr = conn.Resolve(c)
			return nil
		},
	}}}
	require.NoError(t, app.RunContext(context.Background(), append([]string{"t", "x"}, args...)))
	return got, rerr
}

const file = `current-context: a
contexts:
- name: a
  servers: {ctx-a: "127.0.0.1:1"}
  ca-cert: certs/ca.crt
  cert: certs/a.crt
  key: /abs/a.key
- name: b
  servers: {ctx-b: "127.0.0.1:2"}
  ca-cert: /b/ca.crt
  cert: /b/b.crt
  key: /b/b.key
- name: nokey
  servers: {ctx-c: "127.0.0.1:3"}
  ca-cert: /c/ca.crt
  cert: /c/c.crt
`

func setup(t *testing.T, body string) string {
	dir := t.TempDir()
	path := filepath.Join(dir, "admin.yaml")
	if body != "" {
		require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	}
	t.Setenv("NSTANCE_ADMIN_CONFIG", path)
	for _, v := range []string{"NSTANCE_ADMIN_SERVERS", "NSTANCE_ADMIN_CA_CERT", "NSTANCE_ADMIN_CERT", "NSTANCE_ADMIN_KEY", "NSTANCE_ADMIN_CONTEXT"} {
		t.Setenv(v, "")
		os.Unsetenv(v)
	}
	return dir
}

func TestPrecedenceFlagThenEnvThenContext(t *testing.T) {
	dir := setup(t, file)

	s, err := resolve(t)
	require.NoError(t, err)
	require.Equal(t, conn.Settings{Servers: map[string]string{"ctx-a": "127.0.0.1:1"}, CACert: filepath.Join(dir, "certs/ca.crt"),
		Cert: filepath.Join(dir, "certs/a.crt"), Key: "/abs/a.key", Context: "a"}, s)

	t.Setenv("NSTANCE_ADMIN_SERVERS", "env=127.0.0.1:5")
	t.Setenv("NSTANCE_ADMIN_KEY", "/env/key")
	s, err = resolve(t)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"env": "127.0.0.1:5"}, s.Servers, "env over context")
	require.Equal(t, "/env/key", s.Key)
	require.Equal(t, filepath.Join(dir, "certs/a.crt"), s.Cert, "what env does not set still comes from the context")

	s, err = resolve(t, "--servers", "flag=127.0.0.1:6", "--cert", "/flag/cert")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"flag": "127.0.0.1:6"}, s.Servers, "flag over env")
	require.Equal(t, "/flag/cert", s.Cert)
	require.Equal(t, "/env/key", s.Key)

	s, err = resolve(t, "--context", "b")
	require.NoError(t, err)
	require.Equal(t, "b", s.Context)
	require.Equal(t, "/b/ca.crt", s.CACert)
	require.Equal(t, map[string]string{"env": "127.0.0.1:5"}, s.Servers)

	t.Setenv("NSTANCE_ADMIN_CONTEXT", "b")
	s, err = resolve(t)
	require.NoError(t, err)
	require.Equal(t, "/b/b.crt", s.Cert)
	s, err = resolve(t, "--context", "a")
	require.NoError(t, err)
	require.Equal(t, "a", s.Context, "--context over NSTANCE_ADMIN_CONTEXT")
}

func TestFileReadOnlyWhenNeeded(t *testing.T) {
	setup(t, "contexts: [") // does not parse
	all := []string{"--servers", "s=127.0.0.1:1", "--ca-cert", "/ca", "--cert", "/c", "--key", "/k"}
	s, err := resolve(t, all...)
	require.NoError(t, err, "every setting given: the file is not needed")
	require.Empty(t, s.Context)

	_, err = resolve(t, all[:6]...)
	require.ErrorContains(t, err, "context file")
	require.ErrorContains(t, err, "did not find expected", "a broken file is reported when it is needed")

	_, err = resolve(t, append(all, "--context", "a")...)
	require.ErrorContains(t, err, "context file", "--context always reads the file")
}

func TestClearErrors(t *testing.T) {
	dir := setup(t, "")
	_, err := resolve(t)
	require.ErrorContains(t, err, "no shard servers: pass --servers")
	require.ErrorContains(t, err, "no context file at "+filepath.Join(dir, "admin.yaml"))
	_, err = resolve(t, "--context", "a")
	require.ErrorContains(t, err, "context file does not exist")
	_, err = resolve(t, "--servers", "s=127.0.0.1:1")
	require.ErrorContains(t, err, "--ca-cert, --cert and --key are required")
	_, err = resolve(t, "--servers", "bad")
	require.ErrorContains(t, err, "shard=host:port")

	setup(t, file)
	_, err = resolve(t, "--context", "nokey")
	require.ErrorContains(t, err, "missing --key")
	require.ErrorContains(t, err, `context "nokey"`)
	_, err = resolve(t, "--context", "zzz")
	require.ErrorContains(t, err, `no context named "zzz" (known: a, b, nokey)`)

	setup(t, "contexts:\n- name: a\n")
	_, err = resolve(t)
	require.ErrorContains(t, err, "no current context")
}
