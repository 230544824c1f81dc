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
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"sigs.k8s.io/yaml"

	"github.com/nstance-dev/nstance/internal/admin/adminapp"
	"github.com/nstance-dev/nstance/internal/admin/shard"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/internal/testing/syncbuf"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
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

// isolate points the context file at a fresh path and clears the
// connection variables, so no test reads the user's settings.
func isolate(t *testing.T) string {
	path := filepath.Join(t.TempDir(), "admin.yaml")
	t.Setenv("NSTANCE_ADMIN_CONFIG", path)
	for _, v := range []string{"NSTANCE_ADMIN_SERVERS", "NSTANCE_ADMIN_CA_CERT", "NSTANCE_ADMIN_CERT", "NSTANCE_ADMIN_KEY", "NSTANCE_ADMIN_CONTEXT"} {
		t.Setenv(v, "")
		os.Unsetenv(v)
	}
	return path
}

func runCtx(ctx context.Context, stdout, stderr io.Writer, args ...string) error {
	app := adminapp.New()
	app.Writer, app.ErrWriter = stdout, stderr
	return adminapp.Run(ctx, app, append([]string{"nstance-admin"}, args...))
}

// run runs nstance-admin and returns its stdout (stderr holds only logs).
func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := runCtx(context.Background(), &out, &errOut, args...)
	return out.String(), err
}

type env struct {
	a, b *shardtest.Shard
	cr   creds
	conn []string
}

func twoShards(t *testing.T) env {
	isolate(t)
	a := shardtest.Start(t, shardtest.Options{ShardID: "dev-1"})
	b := shardtest.Start(t, shardtest.Options{ShardID: "dev-2", CA: a.CA})
	cr := writeCreds(t, a, "default")
	return env{a: a, b: b, cr: cr,
		conn: []string{"--servers", "dev-1=" + a.OperatorAddr + ",dev-2=" + b.OperatorAddr, "--ca-cert", cr.ca, "--cert", cr.cert, "--key", cr.key}}
}

func (e env) args(cmd string, extra ...string) []string {
	return append(append(strings.Fields(cmd), e.conn...), extra...)
}

// waitGroup waits until a group has n running instances.
func waitGroup(t *testing.T, sh *shardtest.Shard, id string, n int) *nstancev1.GroupStatus {
	t.Helper()
	c := sh.Client(t, "default")
	var g *nstancev1.GroupStatus
	require.Eventually(t, func() bool {
		g, _ = shard.FindGroup(context.Background(), c, id)
		return g != nil && int(g.GetActualSize()) == n && int(g.GetReadyCount()) == n
	}, 20*time.Second, 20*time.Millisecond, "group %s never reached %d running instances", id, n)
	return g
}

type list struct {
	Items []map[string]any `json:"items"`
}

func decodeList(t *testing.T, out string) list {
	t.Helper()
	var l list
	require.NoError(t, json.Unmarshal([]byte(out), &l), out)
	return l
}

func TestGroupCommandsAgainstRunningShards(t *testing.T) {
	e := twoShards(t)

	out, err := run(t, e.args("group create", "--shard", "dev-1", "--template", "worker", "--size", "2", "--var", "role=db", "db")...)
	require.NoError(t, err)
	require.Equal(t, "dev-1: group db created (size 2)\n", out)
	waitGroup(t, e.a, "db", 2)
	out, err = run(t, e.args("group list", "--all-shards")...)
	require.NoError(t, err)
	require.Equal(t, ""+
		"SHARD  GROUP  TEMPLATE  SIZE  ACTUAL  READY  STATIC\n"+
		"dev-1  db     worker    2     2       2      false\n", out)

	// Flags may follow the argument.
	out, err = run(t, e.args("group scale db", "--shard", "dev-1", "--size", "1")...)
	require.NoError(t, err, out)
	require.Contains(t, out, "scaled to 1")
	out, err = run(t, e.args("group status db", "--shard", "dev-1")...)
	require.NoError(t, err)
	require.Contains(t, out, "size: 1")
	require.Contains(t, out, "vars: role=db")
	require.Contains(t, out, "nstance://test-cluster/dev-1/db-")

	out, err = run(t, e.args("group list", "--all-shards", "-o", "json")...)
	require.NoError(t, err)
	l := decodeList(t, out)
	require.Len(t, l.Items, 1)
	require.Equal(t, "dev-1", l.Items[0]["shard"])
	require.Equal(t, "db", l.Items[0]["spec"].(map[string]any)["group_id"])

	out, err = run(t, e.args("group status db", "--shard", "dev-1", "-o", "yaml")...)
	require.NoError(t, err)
	var y list
	require.NoError(t, yaml.UnmarshalStrict([]byte(out), &y), out)
	require.Equal(t, float64(1), y.Items[0]["spec"].(map[string]any)["size"])

	out, err = run(t, e.args("config status", "--all-shards")...)
	require.NoError(t, err)
	require.Regexp(t, `(?m)^SHARD +ETAG +LAST MODIFIED\ndev-1 +\S+ +\S+\ndev-2 +\S+ +\S+\n$`, out)
	out, err = run(t, e.args("config status", "--all-shards", "-o", "json")...)
	require.NoError(t, err)
	l = decodeList(t, out)
	require.Len(t, l.Items, 2)
	require.Equal(t, "dev-2", l.Items[1]["shard"])
	require.NotEmpty(t, l.Items[1]["etag"])
	out, err = run(t, e.args("config refresh", "--shard", "dev-2")...)
	require.NoError(t, err)
	require.Contains(t, out, "not_modified")
	out, err = run(t, e.args("config refresh", "--shard", "dev-2", "-o", "json")...)
	require.NoError(t, err)
	require.Equal(t, "REFRESH_CONFIG_OUTCOME_NOT_MODIFIED", decodeList(t, out).Items[0]["outcome"])

	out, err = run(t, e.args("group delete db", "--shard", "dev-1", "-o", "json")...)
	require.NoError(t, err)
	require.Equal(t, "db", decodeList(t, out).Items[0]["group_id"])

	// Errors are clear and name the shard.
	_, err = run(t, e.args("group list")...)
	require.ErrorContains(t, err, "--shard NAME or --all-shards")
	_, err = run(t, e.args("group scale nope", "--shard", "dev-2", "--size", "3")...)
	require.ErrorContains(t, err, "shard dev-2")
	require.ErrorContains(t, err, `group "nope" not found`)
	_, err = run(t, e.args("group create x", "--shard", "dev-1", "--template", "missing")...)
	require.ErrorContains(t, err, "unknown template")
	_, err = run(t, "group", "list", "--servers", "bad")
	require.ErrorContains(t, err, "shard=host:port")
	_, err = run(t, "group", "list", "--servers", "dev-1="+e.a.OperatorAddr)
	require.ErrorContains(t, err, "--ca-cert, --cert and --key are required")
}

// Every printing command refuses an unknown -o before doing anything.
func TestBogusOutputRefused(t *testing.T) {
	e := twoShards(t)
	for _, cmd := range []string{
		"group list --all-shards", "group status db --shard dev-1", "group create db --shard dev-1 --template worker",
		"group scale db --shard dev-1 --size 3", "group delete db --shard dev-1", "config status --all-shards", "config refresh --all-shards",
		"instance list --all-shards", "instance get x", "instance delete x", "instance ack-drain x",
	} {
		_, err := run(t, e.args(cmd, "-o", "bogus")...)
		require.EqualError(t, err, `unknown output format "bogus": want one of table, json, yaml`, cmd)
	}
	resp, err := e.a.Client(t, "default").ListGroups(context.Background(), &nstancev1.ListGroupsRequest{})
	require.NoError(t, err)
	require.Empty(t, resp.GetGroups(), "group create -o bogus created nothing")
}

func TestInstanceCommands(t *testing.T) {
	e := twoShards(t)
	_, err := run(t, e.args("group create web", "--shard", "dev-1", "--template", "worker", "--size", "2")...)
	require.NoError(t, err)
	_, err = run(t, e.args("group create db", "--shard", "dev-2", "--template", "worker", "--size", "1")...)
	require.NoError(t, err)
	waitGroup(t, e.a, "web", 2)
	waitGroup(t, e.b, "db", 1)

	out, err := run(t, e.args("instance list", "--all-shards")...)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4, out)
	require.Regexp(t, `^SHARD +INSTANCE +GROUP +STATE +PROVIDER ID +AGE$`, lines[0])
	require.Regexp(t, `^dev-1 +web-[0-9a-f]{8} +web +running +nstance://test-cluster/dev-1/web-[0-9a-f]{8} +\d+s$`, lines[1])
	require.Regexp(t, `^dev-2 +db-[0-9a-f]{8} +db +running +\S+ +\d+s$`, lines[3])

	out, err = run(t, e.args("instance list", "--all-shards", "--group", "web", "-o", "json")...)
	require.NoError(t, err)
	web := decodeList(t, out).Items
	require.Len(t, web, 2)
	victim := web[0]["instance_id"].(string)
	require.Equal(t, "INSTANCE_STATE_RUNNING", web[0]["state"])
	require.Equal(t, "dev-1", web[0]["shard"])

	// get looks on every shard unless told which.
	out, err = run(t, e.args("instance get", victim)...)
	require.NoError(t, err)
	require.Contains(t, out, "instance: "+victim+"\nshard: dev-1\ngroup: web\ntemplate: worker\nstate: running\n")
	out, err = run(t, e.args("instance get", victim, "-o", "yaml")...)
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(out), &got))
	require.Equal(t, victim, got["instance_id"])
	_, err = run(t, e.args("instance get nope-00000000")...)
	require.EqualError(t, err, `instance "nope-00000000" not found on shard dev-1, dev-2`)
	_, err = run(t, e.args("instance get", victim, "--shard", "dev-2")...)
	require.ErrorContains(t, err, "not found on shard dev-2")
	_, err = run(t, e.args("instance list", "--all-shards", "--state", "bogus")...)
	require.ErrorContains(t, err, `--state "bogus": want one of creating, deleted, deleting, failed, pending, pending_deletion, running`)

	// ack-drain before a deletion is a conflict, reported as such.
	_, err = run(t, e.args("instance ack-drain", victim)...)
	require.ErrorContains(t, err, "not pending deletion")

	out, err = run(t, e.args("instance delete", victim)...)
	require.NoError(t, err)
	require.Contains(t, out, "dev-1: instance "+victim+" is pending_deletion until its drain is acknowledged (nstance-admin instance ack-drain "+victim+")")

	out, err = run(t, e.args("instance list", "--all-shards", "--state", "pending-deletion", "-o", "json")...)
	require.NoError(t, err)
	pending := decodeList(t, out).Items
	require.Len(t, pending, 1)
	require.Equal(t, victim, pending[0]["instance_id"])
	require.NotNil(t, pending[0]["drain_deadline"])

	out, err = run(t, e.args("instance ack-drain", victim, "-o", "json")...)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal([]byte(out), &got), out)
	require.Contains(t, []any{"INSTANCE_STATE_DELETING", "INSTANCE_STATE_PENDING_DELETION"}, got["state"])
	require.Eventually(t, func() bool {
		_, err := run(t, e.args("instance get", victim)...)
		return err != nil && strings.Contains(err.Error(), "not found")
	}, 20*time.Second, 50*time.Millisecond, "the acknowledged instance is deleted")

	// --skip-drain deletes at once.
	out, err = run(t, e.args("instance list", "--shard", "dev-2", "-o", "json")...)
	require.NoError(t, err)
	dbID := decodeList(t, out).Items[0]["instance_id"].(string)
	out, err = run(t, e.args("instance delete", dbID, "--skip-drain")...)
	require.NoError(t, err)
	require.Contains(t, out, "it is deleted without waiting for a drain")
	require.Eventually(t, func() bool {
		_, err := run(t, e.args("instance get", dbID)...)
		return err != nil && strings.Contains(err.Error(), "not found")
	}, 20*time.Second, 50*time.Millisecond, "the instance is deleted without an acknowledgement")
}

// watch runs a --watch command until stop is called; stop returns its error.
func watch(t *testing.T, args ...string) (out *syncbuf.Buffer, stop func() error) {
	out, _, stop = watchLogs(t, args...)
	return out, stop
}

// watchLogs is watch that also returns what the command logs.
func watchLogs(t *testing.T, args ...string) (out, logs *syncbuf.Buffer, stop func() error) {
	t.Helper()
	out, logs = &syncbuf.Buffer{}, &syncbuf.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- runCtx(ctx, out, logs, args...) }()
	stopped := false
	var result error
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			select {
			case result = <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("the watch did not stop within 10s after its context ended; output:\n%s", out.String())
			}
		}
		return result
	}
	t.Cleanup(func() { _ = stop() })
	return out, logs, stop
}

// waitFor waits until the output contains want, failing with the output.
func waitFor(t *testing.T, out *syncbuf.Buffer, want func(string) bool, what string) {
	t.Helper()
	require.Eventually(t, func() bool { return want(out.String()) }, 20*time.Second, 20*time.Millisecond, "%s; output so far:\n%s", what, out)
}

type wev struct {
	Type   string         `json:"type"`
	Object map[string]any `json:"object"`
}

func events(t *testing.T, out string) []wev {
	t.Helper()
	var evs []wev
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var ev wev
		require.NoError(t, json.Unmarshal([]byte(line), &ev), line)
		evs = append(evs, ev)
	}
	return evs
}

func hasGroupEvent(t *testing.T, typ, id string, size float64) func(string) bool {
	return func(out string) bool {
		for _, ev := range events(t, out) {
			spec, _ := ev.Object["spec"].(map[string]any)
			if ev.Type == typ && spec["group_id"] == id && (size < 0 || spec["size"] == size) {
				return true
			}
		}
		return false
	}
}

func TestWatchGroupsPrintsLaterChanges(t *testing.T) {
	e := twoShards(t)
	_, err := run(t, e.args("group create db", "--shard", "dev-1", "--template", "worker", "--size", "1")...)
	require.NoError(t, err)
	waitGroup(t, e.a, "db", 1)

	out, stop := watch(t, e.args("group list", "--all-shards", "--watch", "-o", "json")...)
	waitFor(t, out, hasGroupEvent(t, "ADDED", "db", 1), "the initial list")

	// Changes go straight through the Operator API: only one nstance-admin
	// runs at a time in this process (urfave/cli keeps global help state).
	ctx := context.Background()
	a, b := e.a.Client(t, "default"), e.b.Client(t, "default")
	_, err = shard.Scale(ctx, a, "db", 2)
	require.NoError(t, err)
	waitFor(t, out, hasGroupEvent(t, "MODIFIED", "db", 2), "the scale-up")
	_, err = b.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "web", Template: "worker"}})
	require.NoError(t, err)
	waitFor(t, out, hasGroupEvent(t, "ADDED", "web", 0), "a group created after the start")
	_, err = b.DeleteGroup(ctx, &nstancev1.DeleteGroupRequest{GroupId: "web"})
	require.NoError(t, err)
	waitFor(t, out, hasGroupEvent(t, "DELETED", "web", -1), "the deletion")
	require.NoError(t, stop(), "a watch ends cleanly when its context ends")
	for _, ev := range events(t, out.String()) {
		require.Contains(t, ev.Object, "shard")
	}

	// Table form: the header and first rows, then change rows.
	out, stop = watch(t, e.args("group list", "--all-shards", "-w")...)
	waitFor(t, out, func(s string) bool {
		return strings.HasPrefix(s, "EVENT     SHARD  GROUP  TEMPLATE  SIZE  ACTUAL  READY  STATIC\nADDED     dev-1  db     worker    2     ")
	}, "the table header and initial row")
	_, err = shard.Scale(ctx, a, "db", 3)
	require.NoError(t, err)
	waitFor(t, out, func(s string) bool { return strings.Contains(s, "\nMODIFIED  dev-1  db     worker    3     ") }, "a MODIFIED row")
	require.NoError(t, stop())
}

func TestWatchInstancesPrintsLaterChanges(t *testing.T) {
	e := twoShards(t)
	ctx := context.Background()
	a := e.a.Client(t, "default")
	_, err := a.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "web", Template: "worker", Size: 1}})
	require.NoError(t, err)
	g := waitGroup(t, e.a, "web", 1)
	id := g.GetProviderIds()[0][strings.LastIndex(g.GetProviderIds()[0], "/")+1:]

	out, stop := watch(t, e.args("instance list", "--shard", "dev-1", "--watch", "--interval", "50ms", "-o", "json")...)
	has := func(typ, id, state string) func(string) bool {
		return func(s string) bool {
			for _, ev := range events(t, s) {
				if ev.Type == typ && ev.Object["instance_id"] == id && (state == "" || ev.Object["state"] == state) {
					return true
				}
			}
			return false
		}
	}
	waitFor(t, out, has("ADDED", id, "INSTANCE_STATE_RUNNING"), "the initial list")

	// Changes made by someone else after the start appear.
	_, err = a.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: id})
	require.NoError(t, err)
	waitFor(t, out, has("MODIFIED", id, "INSTANCE_STATE_PENDING_DELETION"), "the deletion request")
	_, err = a.AcknowledgeDrained(ctx, &nstancev1.AcknowledgeDrainedRequest{InstanceId: id})
	require.NoError(t, err)
	waitFor(t, out, has("DELETED", id, ""), "the instance gone")
	waitFor(t, out, func(s string) bool {
		for _, ev := range events(t, s) {
			if ev.Type == "ADDED" && ev.Object["instance_id"] != id {
				return true
			}
		}
		return false
	}, "its replacement")
	require.NoError(t, stop())
}

func TestContextFileAgainstShards(t *testing.T) {
	e := twoShards(t)
	other := shardtest.Start(t, shardtest.Options{ShardID: "dev-3", CA: e.a.CA})
	_, err := run(t, "context", "set", "dev", "--servers", "dev-1="+e.a.OperatorAddr, "--ca-cert", e.cr.ca, "--cert", e.cr.cert, "--key", e.cr.key)
	require.NoError(t, err)

	status := func(args ...string) string {
		t.Helper()
		out, err := run(t, append([]string{"config", "status", "--all-shards", "-o", "json"}, args...)...)
		require.NoError(t, err)
		var shards []string
		for _, it := range decodeList(t, out).Items {
			shards = append(shards, it["shard"].(string))
		}
		return strings.Join(shards, ",")
	}
	require.Equal(t, "dev-1", status(), "the context alone is enough")
	t.Setenv("NSTANCE_ADMIN_SERVERS", "dev-2="+e.b.OperatorAddr)
	require.Equal(t, "dev-2", status(), "the environment overrides the context")
	require.Equal(t, "dev-3", status("--servers", "dev-3="+other.OperatorAddr), "a flag overrides the environment")

	// A context with a wrong key fails with the TLS error, and --key fixes it.
	_, err = run(t, "context", "set", "broken", "--servers", "dev-1="+e.a.OperatorAddr, "--ca-cert", e.cr.ca, "--cert", e.cr.cert, "--key", e.cr.ca)
	require.NoError(t, err)
	_, err = run(t, "config", "status", "--context", "broken", "--all-shards")
	require.ErrorContains(t, err, "loading operator certificate")
	require.Equal(t, "dev-2", status("--context", "broken", "--key", e.cr.key))
}

// JSON on stdout stays parseable however much is logged on stderr.
func TestLogsStayOnStderr(t *testing.T) {
	e := twoShards(t)
	var out, errOut bytes.Buffer
	require.NoError(t, runCtx(context.Background(), &out, &errOut, e.args("group list", "--all-shards", "-o", "json", "--log-level", "debug")...))
	require.True(t, json.Valid(out.Bytes()), out.String())
	require.Contains(t, errOut.String(), `"msg":"connecting"`)
	_, err := run(t, e.args("group list", "--all-shards", "--log-level", "loud")...)
	require.ErrorContains(t, err, `log level "loud"`)
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
		ct := "application/json"
		if c, rest, ok := strings.Cut(body, "|"); ok && !strings.HasPrefix(body, "{") {
			ct, body = c, rest // "content/type|body"
		}
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		if body != "" {
			req.Header.Set("Content-Type", ct)
		}
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
		{"scale unknown field", "POST", "/v1/shards/dev-1/groups/api/scale", `{"size":1,"x":1}`, 400, `unknown field \"x\"`},
		{"scale trailing data", "POST", "/v1/shards/dev-1/groups/api/scale", `{"size":1}}`, 400, "data after the JSON object"},
		{"scale two objects", "POST", "/v1/shards/dev-1/groups/api/scale", `{"size":1} {"size":0}`, 400, "data after the JSON object"},
		{"scale string size", "POST", "/v1/shards/dev-1/groups/api/scale", `{"size":"1"}`, 400, "size"},
		{"scale text/plain", "POST", "/v1/shards/dev-1/groups/api/scale", `text/plain|{"size":0}`, 415, "application/json"},
		{"scale too large", "POST", "/v1/shards/dev-1/groups/api/scale", `{"size":1,"pad":"` + strings.Repeat("x", 1<<20) + `"}`, 413, "body over 1048576 bytes"},
		{"put text/plain", "PUT", "/v1/shards/dev-1/groups/api", `text/plain|{"template":"worker","size":0}`, 415, "application/json"},
		{"put unknown field", "PUT", "/v1/shards/dev-1/groups/api", `{"template":"worker","size":0,"x":1}`, 400, "GroupSpec"},
		{"no route", "GET", "/v1/shards/dev-1/nothing", "", 404, `"error"`},
		{"wrong method", "PATCH", "/v1/shards/dev-1/groups/api", "", 405, `"error"`},
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
			if code >= 400 {
				require.True(t, json.Valid([]byte(body)), "errors are JSON: %s", body)
			}
		})
	}
}

func TestOperatorAndRevocationCommands(t *testing.T) {
	e := twoShards(t)
	opTLS, err := e.a.OperatorTLS("default", pki.RoleOperator, "op-x")
	require.NoError(t, err)
	opConn, err := grpc.NewClient(e.a.OperatorAddr, grpc.WithTransportCredentials(credentials.NewTLS(opTLS)))
	require.NoError(t, err)
	t.Cleanup(func() { opConn.Close() })
	op := nstancev1.NewOperatorServiceClient(opConn)
	_, err = op.GetConfigStatus(context.Background(), &nstancev1.GetConfigStatusRequest{})
	require.NoError(t, err)

	out, err := run(t, e.args("operator list", "--shard", "dev-1", "-o", "json")...)
	require.NoError(t, err)
	l := decodeList(t, out)
	require.Len(t, l.Items, 1)
	require.Equal(t, "op-x", l.Items[0]["operator_id"])
	require.Equal(t, "CLIENT_ROLE_OPERATOR", l.Items[0]["role"])

	// Tenant "other" has an operator op-x too: a bare id is ambiguous.
	otherTLS, err := e.a.OperatorTLS("other", pki.RoleOperator, "op-x")
	require.NoError(t, err)
	_, err = run(t, e.args("operator revoke", "op-x", "--shard", "dev-1")...)
	require.ErrorContains(t, err, "default, other")
	out, err = run(t, e.args("operator revoke", "op-x", "--tenant", "default", "--shard", "dev-1", "--reason", "left the team")...)
	require.NoError(t, err)
	require.Contains(t, out, "kind: operator\n")
	require.Contains(t, out, "subject: default/op-x\n")
	require.Contains(t, out, "reason: left the team\n")
	_, err = op.GetConfigStatus(context.Background(), &nstancev1.GetConfigStatusRequest{})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	otherConn, err := grpc.NewClient(e.a.OperatorAddr, grpc.WithTransportCredentials(credentials.NewTLS(otherTLS)))
	require.NoError(t, err)
	t.Cleanup(func() { otherConn.Close() })
	_, err = nstancev1.NewOperatorServiceClient(otherConn).GetConfigStatus(context.Background(), &nstancev1.GetConfigStatusRequest{})
	require.NoError(t, err, "tenant other's op-x is someone else")

	_, err = run(t, e.args("group create", "--shard", "dev-1", "--template", "worker", "--size", "1", "db")...)
	require.NoError(t, err)
	g := waitGroup(t, e.a, "db", 1)
	inst := g.GetProviderIds()[0][strings.LastIndex(g.GetProviderIds()[0], "/")+1:]
	out, err = run(t, e.args("instance revoke", inst, "-o", "json")...)
	require.NoError(t, err)
	require.Contains(t, out, `"kind": "REVOCATION_KIND_AGENT"`)

	out, err = run(t, e.args("revocation list", "--all-shards")...)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out)
	require.Regexp(t, `^SHARD\s+KIND\s+SUBJECT\s+SERIAL\s+REVOKED\s+EXPIRES\s+BY\s+REASON$`, lines[0])
	require.Regexp(t, `^dev-1\s+operator\s+default/op-x\s+-\s+\S+\s+\S+\s+spiffe://test-cluster/tenant/default/admin/admin\s+left the team$`, lines[1])
	require.Regexp(t, `^dev-1\s+agent\s+dev-1/`+inst+`\s`, lines[2])

	_, err = run(t, e.args("revocation add", "12ab", "--shard", "dev-1")...)
	require.ErrorContains(t, err, "want a decimal certificate serial number")
	_, err = run(t, e.args("revocation add", "4242", "--shard", "dev-2")...)
	require.NoError(t, err)
	out, err = run(t, e.args("revocation list", "--shard", "dev-2", "-o", "json")...)
	require.NoError(t, err)
	l = decodeList(t, out)
	require.Len(t, l.Items, 1)
	require.Equal(t, "4242", l.Items[0]["serial"])
	require.Equal(t, "dev-2", l.Items[0]["shard"], "the item's shard is the shard that answered")
}
