package clustercmd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/admin/adminapp"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/pkg/objstore/dirstore"
)

func runAdminStdin(t *testing.T, stdin string, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	a := adminapp.New()
	a.Reader, a.Writer, a.ErrWriter = strings.NewReader(stdin), &out, &errOut
	err := adminapp.Run(context.Background(), a, append([]string{"nstance-admin"}, args...))
	return out.String(), err
}

// The value goes in from stdin or a file, is sealed at
// cluster/secret/files/{name} with the object key as its name (what the
// server opens), and is never printed.
func TestClusterSecretPutListDelete(t *testing.T) {
	t.Setenv("NSTANCE_ENCRYPTION_KEY", encKey)
	dir := t.TempDir()
	st := []string{"--storage", "file", "--storage-dir", dir, "--prefix", "pre"}
	run := func(stdin string, args ...string) (string, error) {
		return runAdminStdin(t, stdin, append(append([]string{"cluster", "secret"}, args...), st...)...)
	}
	out, err := run("hunter2\n", "put", "db-password")
	require.NoError(t, err)
	require.Contains(t, out, "key: pre/cluster/secret/files/db-password")
	require.Contains(t, out, "bytes: 8")
	require.NotContains(t, out, "hunter2")
	f := filepath.Join(t.TempDir(), "tls.key")
	require.NoError(t, os.WriteFile(f, []byte("-----BEGIN KEY-----"), 0o600))
	_, err = run("", "put", "tls-key", "--from-file", f)
	require.NoError(t, err)

	objs, err := dirstore.Open(dir)
	require.NoError(t, err)
	k, err := secrets.ParseKey([]byte(encKey))
	require.NoError(t, err)
	ring, err := secrets.NewKeyring(k)
	require.NoError(t, err)
	store := &secrets.Store{Objects: objs, Ring: ring}
	keys := layout.New("pre")
	got, err := store.Get(context.Background(), keys.FileSecret("db-password"))
	require.NoError(t, err)
	require.Equal(t, "hunter2\n", string(got))
	raw, err := objs.Get(context.Background(), keys.FileSecret("db-password"))
	require.NoError(t, err)
	require.NotContains(t, string(raw.Body), "hunter2", "sealed at rest")

	out, err = run("", "list", "-o", "json")
	require.NoError(t, err)
	var list struct {
		Items []struct {
			Name  string `json:"name"`
			KeyID string `json:"key_id"`
		} `json:"items"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &list), out)
	require.Len(t, list.Items, 2)
	require.Equal(t, "db-password", list.Items[0].Name)
	require.Equal(t, "tls-key", list.Items[1].Name)
	require.Equal(t, ring.CurrentID(), list.Items[0].KeyID)
	require.NotContains(t, out, "hunter2")

	_, err = run("", "delete", "db-password")
	require.NoError(t, err)
	_, err = run("", "delete", "db-password")
	require.ErrorContains(t, err, `file secret "db-password" does not exist`)
	out, err = run("", "list")
	require.NoError(t, err)
	require.NotContains(t, out, "db-password")
	require.Contains(t, out, "tls-key")

	for _, tc := range []struct {
		args  []string
		stdin string
		want  string
	}{
		{[]string{"put"}, "x", "want exactly one argument"},
		{[]string{"put", "a/b"}, "x", "invalid secret name"},
		{[]string{"put", "db", "value-on-the-command-line"}, "x", "want exactly one argument"},
		{[]string{"put", "db"}, "", "is empty"},
		{[]string{"put", "db", "--from-file", filepath.Join(dir, "none")}, "", "--from-file"},
	} {
		_, err := run(tc.stdin, tc.args...)
		require.ErrorContains(t, err, tc.want, "%v", tc.args)
	}
}
