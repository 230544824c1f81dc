package shardcmd_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/urfave/cli/v2"

	"github.com/nstance-dev/nstance/internal/admin/shard"
	"github.com/nstance-dev/nstance/internal/admin/shardcmd"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
)

type creds struct{ ca, cert, key string }

func writeCreds(t *testing.T, sh *shardtest.Shard, tenant string) creds {
	dir := t.TempDir()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	_, certPEM, err := sh.CA.IssueClient(pki.ClientRequest{
		Identity:  pki.Identity{ClusterID: sh.ClusterID, Tenant: tenant, Role: pki.RoleAdmin, ClientID: "admin"},
		PublicKey: pub, Validity: time.Hour,
	}, time.Now())
	require.NoError(t, err)
	keyPEM, err := pki.MarshalPrivateKeyPEM(priv)
	require.NoError(t, err)
	c := creds{filepath.Join(dir, "ca.crt"), filepath.Join(dir, "op.crt"), filepath.Join(dir, "op.key")}
	require.NoError(t, os.WriteFile(c.ca, sh.CA.CertPEM, 0o644))
	require.NoError(t, os.WriteFile(c.cert, certPEM, 0o644))
	require.NoError(t, os.WriteFile(c.key, keyPEM, 0o600))
	return c
}

func run(t *testing.T, args ...string) (string, error) {
	var out bytes.Buffer
	app := &cli.App{Name: "nstance-admin", Commands: shardcmd.Commands(), Writer: &out, ErrWriter: &out}
	err := app.RunContext(context.Background(), append([]string{"nstance-admin"}, args...))
	return out.String(), err
}

func TestGroupCommandsAgainstRunningShards(t *testing.T) {
	a := shardtest.Start(t, shardtest.Options{ShardID: "dev-1"})
	b := shardtest.Start(t, shardtest.Options{ShardID: "dev-2", CA: a.CA})
	cr := writeCreds(t, a, "default")
	conn := []string{"--servers", "dev-1=" + a.OperatorAddr + ",dev-2=" + b.OperatorAddr, "--ca-cert", cr.ca, "--cert", cr.cert, "--key", cr.key}
	with := func(sub []string, extra ...string) []string {
		return append(append(append([]string{}, sub...), conn...), extra...)
	}

	_, err := run(t, with([]string{"group", "create"}, "--shard", "dev-1", "--template", "worker", "--size", "2", "--var", "role=db", "db")...)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		out, err := run(t, with([]string{"group", "list"}, "--all-shards")...)
		return err == nil && strings.Contains(out, "dev-1  db     worker    2     2       2      false")
	}, 10*time.Second, 50*time.Millisecond)

	out, err := run(t, with([]string{"group", "scale"}, "--shard", "dev-1", "--size", "1", "db")...)
	require.NoError(t, err, out)
	require.Contains(t, out, "scaled to 1")
	out, err = run(t, with([]string{"group", "status"}, "--shard", "dev-1", "db")...)
	require.NoError(t, err)
	require.Contains(t, out, "size: 1")
	require.Contains(t, out, "vars: role=db")
	require.Contains(t, out, "nstance://test-cluster/dev-1/db-")

	out, err = run(t, with([]string{"group", "list"}, "--all-shards", "-o", "json")...)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	var first struct {
		Shard  string          `json:"shard"`
		Result json.RawMessage `json:"result"`
	}
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &first))
	require.Equal(t, "dev-1", first.Shard)

	out, err = run(t, with([]string{"config", "status"}, "--all-shards")...)
	require.NoError(t, err)
	require.Contains(t, out, "dev-1")
	require.Contains(t, out, "dev-2")
	out, err = run(t, with([]string{"config", "refresh"}, "--shard", "dev-2")...)
	require.NoError(t, err)
	require.Contains(t, out, "not_modified")

	_, err = run(t, with([]string{"group", "delete"}, "--shard", "dev-1", "db")...)
	require.NoError(t, err)

	// Errors are clear and name the shard.
	_, err = run(t, with([]string{"group", "list"})...)
	require.ErrorContains(t, err, "--shard NAME or --all-shards")
	_, err = run(t, with([]string{"group", "scale"}, "--shard", "dev-2", "--size", "3", "nope")...)
	require.ErrorContains(t, err, "shard dev-2")
	require.ErrorContains(t, err, `group "nope" not found`)
	_, err = run(t, with([]string{"group", "create"}, "--shard", "dev-1", "--template", "missing", "x")...)
	require.ErrorContains(t, err, "unknown template")
	_, err = run(t, "group", "list", "--servers", "bad")
	require.ErrorContains(t, err, "shard=host:port")
	_, err = run(t, "group", "list", "--servers", "dev-1="+a.OperatorAddr)
	require.ErrorContains(t, err, "--ca-cert, --cert and --key are required")
}

func TestHTTPAPI(t *testing.T) {
	sh := shardtest.Start(t, shardtest.Options{ShardID: "dev-1"})
	cr := writeCreds(t, sh, "default")
	tc, err := shard.Credentials{CACertFile: cr.ca, CertFile: cr.cert, KeyFile: cr.key}.TLSConfig()
	require.NoError(t, err)
	set, err := shard.Dial(map[string]string{"dev-1": sh.OperatorAddr}, tc)
	require.NoError(t, err)
	t.Cleanup(set.Close)
	srv := httptest.NewServer(shard.Handler(set))
	t.Cleanup(srv.Close)

	do := func(method, path, body string) (int, string) {
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	tests := []struct {
		name, method, path, body string
		code                     int
		contains                 string
	}{
		{"shards", "GET", "/v1/shards", "", 200, `"dev-1"`},
		{"config", "GET", "/v1/shards/dev-1/config", "", 200, `"etag"`},
		{"refresh", "POST", "/v1/shards/dev-1/config/refresh", "", 200, "NOT_MODIFIED"},
		{"create", "PUT", "/v1/shards/dev-1/groups/api", `{"template":"worker","size":2}`, 200, `"created":true`},
		{"bad spec", "PUT", "/v1/shards/dev-1/groups/api", `{"template":`, 400, "GroupSpec"},
		{"unknown template", "PUT", "/v1/shards/dev-1/groups/x", `{"template":"nope"}`, 400, "unknown template"},
		{"scale", "POST", "/v1/shards/dev-1/groups/api/scale", `{"size":1}`, 200, `"size":1`},
		{"scale bad body", "POST", "/v1/shards/dev-1/groups/api/scale", `{"size":-1}`, 400, "size"},
		{"scale unknown", "POST", "/v1/shards/dev-1/groups/nope/scale", `{"size":1}`, 404, "not found"},
		{"get", "GET", "/v1/shards/dev-1/groups/api", "", 200, `"group_id":"api"`},
		{"unknown shard", "GET", "/v1/shards/dev-9/groups", "", 404, "unknown shard"},
		{"delete", "DELETE", "/v1/shards/dev-1/groups/api", "", 200, `"group_id":"api"`},
		{"delete again", "DELETE", "/v1/shards/dev-1/groups/api", "", 404, "not found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, body := do(tc.method, tc.path, tc.body)
			require.Equal(t, tc.code, code, body)
			require.Contains(t, body, tc.contains)
		})
	}
}
