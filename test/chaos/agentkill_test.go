package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/agent/identity"
	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/testing/proctest"
	"github.com/nstance-dev/nstance/test/agent/agenttest"
)

// killMoment names the file event at which the agent is killed: a file of
// the identity directory whose name starts with prefix is created.
type killMoment struct {
	name   string
	prefix string
	// stored: the certificate was on disk at the kill, so the restarted
	// agent must not register again; otherwise it registers again with
	// the same key (and the server answers with the same certificate).
	stored bool
}

// kill -9 of an agent right after RegisterAgent returned: the agent is
// killed the instant its certificate lands in its identity directory (an
// fsnotify event, before it removed its nonce or opened the Agent stream),
// started again by the test with the same environment, and must come back
// with the identity it got: the same certificate, on the Agent service,
// with no second registration (its nonce is single-use). CHAOS_KILL_RUNS
// instances each (3 in make test).
func TestAgentKilledAfterRegistration(t *testing.T) {
	runs := envInt(t, "CHAOS_KILL_RUNS", 3)
	bin := agentBinary(t)
	for _, m := range []killMoment{
		// The certificate is stored (renamed into place): registration is
		// complete on both sides.
		{name: "certificate stored", prefix: identity.CertFile, stored: true},
		// The reply arrived and the certificate is being written: the
		// agent restarts with its nonce and key and must get the same
		// certificate again, which needs retry-safe registration.
		{name: "reply received, certificate not stored", prefix: "." + identity.CertFile + ".tmp-"},
	} {
		t.Run(m.name, func(t *testing.T) {
			shard, err := agenttest.New(logr.Discard())
			require.NoError(t, err)
			require.NoError(t, shard.Start())
			t.Cleanup(shard.Stop)
			tmpl := config.Template{Kind: "worker", Files: map[string]config.TemplateFile{"motd": {Kind: "string", Content: "{{ .InstanceID }}"}}}
			for i := 1; i <= runs; i++ {
				killAfterRegistration(t, shard, bin, tmpl, fmt.Sprintf("kill-%d", i), m)
			}
			// A client killed mid-handshake aborts it (counted apart); no
			// handshake may be refused.
			require.Zero(t, shard.HandshakeFailures.Load(), "refused TLS handshakes")
			t.Logf("%d runs: %d handshakes aborted by a killed agent, none refused", runs, shard.HandshakesAborted.Load())
		})
	}
}

func killAfterRegistration(t *testing.T, shard *agenttest.Shard, bin string, tmpl config.Template, id string, m killMoment) {
	t.Helper()
	dir := t.TempDir()
	env, err := shard.Add(agenttest.Instance{ID: id, Group: "g", Template: tmpl}, dir)
	require.NoError(t, err)
	env = append(env, "NSTANCE_METRICS_INTERVAL=200ms", "NSTANCE_RECONNECT_MIN=50ms", "NSTANCE_RECONNECT_MAX=500ms")
	idDir := filepath.Join(dir, id, "identity")

	w, err := fsnotify.NewWatcher()
	require.NoError(t, err)
	defer w.Close()
	require.NoError(t, w.Add(idDir))
	// The agents are killed when the test ends, as systemd would on a VM;
	// the test kills one and starts it again with the same environment
	// and directories.
	agents := proctest.NewGroup(t, proctest.Options{LogDir: dir, TailLines: 60})
	a, err := agents.Start(id+"-agent", bin, env)
	require.NoError(t, err)
	killed := false
	deadline := time.After(60 * time.Second)
	for !killed {
		select {
		case ev := <-w.Events:
			if ev.Has(fsnotify.Create) && strings.HasPrefix(filepath.Base(ev.Name), m.prefix) {
				a.Kill()
				killed = true
			}
		case err := <-w.Errors:
			t.Fatalf("%s: watching %s: %v", id, idDir, err)
		case <-a.Done:
			t.Fatalf("%s: the agent exited before it registered:\n%s", id, proctest.Tail(a.Log, 60))
		case <-deadline:
			t.Fatalf("%s: no %s* was written in 60s", id, m.prefix)
		}
	}
	streams := shard.FileStreams.Load()
	key, err := os.ReadFile(filepath.Join(idDir, identity.KeyFile))
	require.NoError(t, err, "%s: the agent key exists before registration", id)

	b, err := agents.Start(id+"-agent-restarted", bin, env)
	require.NoError(t, err)
	exited := false
	require.Eventually(t, func() bool {
		select {
		case <-b.Done:
			exited = true
			return true
		default:
		}
		rec, ok := shard.Health.Get(id)
		return ok && rec.Last != nil && rec.Last.GetConfigHash() != ""
	}, 30*time.Second, 50*time.Millisecond, "%s: the restarted agent reconnects and reports", id)
	require.False(t, exited, "%s: the restarted agent exited:\n%s", id, proctest.Tail(b.Log, 60))
	require.Greater(t, shard.FileStreams.Load(), streams)
	d, err := identity.Open(idDir)
	require.NoError(t, err)
	c, err := d.Certificate(time.Now())
	require.NoError(t, err, "%s: the identity survived the kill", id)
	require.Equal(t, id, c.Leaf.Subject.CommonName)
	_, err = os.Stat(filepath.Join(idDir, identity.NonceFile))
	require.ErrorIs(t, err, os.ErrNotExist, "%s: the used nonce is gone", id)
	after, err := os.ReadFile(filepath.Join(idDir, identity.KeyFile))
	require.NoError(t, err)
	require.Equal(t, key, after, "%s: the same key before and after the kill", id)
	if m.stored {
		require.False(t, proctest.LogContains(b.Log, "registered"), "%s: the restarted agent did not register again", id)
	}
	b.Kill()
}
