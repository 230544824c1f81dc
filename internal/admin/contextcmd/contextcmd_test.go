package contextcmd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/admin/adminapp"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	app := adminapp.New()
	app.Writer, app.ErrWriter = &out, &errOut
	err := adminapp.Run(context.Background(), app, append([]string{"nstance-admin", "context"}, args...))
	return out.String(), err
}

func setup(t *testing.T) (dir, path string) {
	dir = t.TempDir()
	path = filepath.Join(dir, "cfg", "admin.yaml")
	t.Setenv("NSTANCE_ADMIN_CONFIG", path)
	for _, f := range []string{"ca.crt", "op.crt", "op.key"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), []byte("x"), 0o600))
	}
	t.Chdir(dir)
	return dir, path
}

func TestSetUseListShowDelete(t *testing.T) {
	dir, path := setup(t)

	out, err := run(t, "set", "dev", "--servers", "dev-1=127.0.0.1:8993,dev-2=127.0.0.1:9003", "--ca-cert", "ca.crt", "--cert", "op.crt", "--key", "op.key")
	require.NoError(t, err)
	require.Equal(t, "context dev created in "+path+" (current)\n", out)
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())

	t.Setenv("NSTANCE_ADMIN_CERT", filepath.Join(dir, "op.crt")) // never copied into a context
	out, err = run(t, "set", "prod", "--servers", "eu-1=10.0.0.1:8993")
	require.NoError(t, err)
	require.Equal(t, "context prod created in "+path+"\n", out, "the current context stays")
	_, err = run(t, "set", "prod", "--key", "op.key")
	require.NoError(t, err)

	out, err = run(t, "list")
	require.NoError(t, err)
	require.Equal(t, ""+
		"CURRENT  NAME  SERVERS\n"+
		"*        dev   dev-1=127.0.0.1:8993,dev-2=127.0.0.1:9003\n"+
		"         prod  eu-1=10.0.0.1:8993\n", out)

	out, err = run(t, "show", "prod", "-o", "json")
	require.NoError(t, err)
	require.JSONEq(t, `{"name":"prod","current":false,"servers":{"eu-1":"10.0.0.1:8993"},"ca-cert":"","cert":"","key":"`+filepath.Join(dir, "op.key")+`"}`, out,
		"set changes only the settings given; paths are stored absolute")

	out, err = run(t, "use", "prod")
	require.NoError(t, err)
	require.Equal(t, "current context is now prod ("+path+")\n", out)
	out, err = run(t, "show")
	require.NoError(t, err)
	require.Contains(t, out, "name: prod\ncurrent: true\n")

	out, err = run(t, "list", "-o", "yaml")
	require.NoError(t, err)
	require.Contains(t, out, "items:\n- ca-cert: "+filepath.Join(dir, "ca.crt"))

	_, err = run(t, "use", "nope")
	require.EqualError(t, err, `no context named "nope" (known: dev, prod)`)
	_, err = run(t, "delete", "prod", "-o", "bogus")
	require.ErrorContains(t, err, "unknown output format")
	out, err = run(t, "delete", "prod", "-o", "json")
	require.NoError(t, err)
	require.JSONEq(t, `{"deleted":"prod","file":"`+path+`"}`, out)
	out, err = run(t, "list", "-o", "json")
	require.NoError(t, err)
	var list struct{ Items []map[string]any }
	require.NoError(t, json.Unmarshal([]byte(out), &list))
	require.Len(t, list.Items, 1)
	require.Equal(t, false, list.Items[0]["current"])
	_, err = run(t, "show")
	require.ErrorContains(t, err, "no current context")
}

func TestBadInputLosesNothing(t *testing.T) {
	_, path := setup(t)
	_, err := run(t, "set", "dev", "--cert", "missing.crt")
	require.ErrorContains(t, err, "--cert")
	require.ErrorContains(t, err, "missing.crt")
	_, err = os.Stat(path)
	require.ErrorIs(t, err, os.ErrNotExist, "nothing written for bad input")
	_, err = run(t, "set", "dev", "--servers", "dev-1")
	require.ErrorContains(t, err, "shard=host:port")
	_, err = run(t, "set", "a/b")
	require.ErrorContains(t, err, "only letters")
	_, err = run(t, "list", "-o", "bogus")
	require.EqualError(t, err, `unknown output format "bogus": want one of table, json, yaml`)

	_, err = run(t, "show")
	require.ErrorContains(t, err, "context file does not exist")

	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o700))
	broken := []byte("current-context: dev\ncontexts:\n- name: dev\n  servers: {dev-1: 127.0.0.1:8993\n")
	require.NoError(t, os.WriteFile(path, broken, 0o644))
	for _, args := range [][]string{{"set", "dev", "--key", "op.key"}, {"use", "dev"}, {"delete", "dev"}} {
		_, err = run(t, args...)
		require.ErrorContains(t, err, "left unchanged", args)
		require.ErrorContains(t, err, path, args)
		b, rerr := os.ReadFile(path)
		require.NoError(t, rerr)
		require.Equal(t, broken, b, "%v must not overwrite a file it cannot parse", args)
	}
	_, err = run(t, "list")
	require.ErrorContains(t, err, path)
}
