package agent_test

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/stretchr/testify/require"

	agentapp "github.com/nstance-dev/nstance/internal/agent/app"
	"github.com/nstance-dev/nstance/internal/agent/config"
	"github.com/nstance-dev/nstance/internal/agent/identity"
	"github.com/nstance-dev/nstance/internal/agent/keys"
	srvconfig "github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/agentapi"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
	"github.com/nstance-dev/nstance/test/agent/agenttest"
)

func template() srvconfig.Template {
	return srvconfig.Template{
		Kind: "worker",
		Keys: map[string]srvconfig.TemplateKey{
			"kubelet": {Type: "ed25519", Certificate: &srvconfig.TemplateCertificate{CommonName: "{{ .InstanceID }}", Usages: []string{"client_auth"}, DNSNames: []string{"{{ .InstanceID }}.nodes"}}},
			"serving": {Type: "ecdsa-p256", Certificate: &srvconfig.TemplateCertificate{CommonName: "serve", Usages: []string{"server_auth"}, IPAddresses: []string{"10.0.0.7"}}},
			"bare":    {Type: "ecdsa-p384"},
		},
		Files: map[string]srvconfig.TemplateFile{
			"kubelet.crt": {Kind: "certificate", Key: "kubelet", Mode: "0644"},
			"serving.crt": {Kind: "certificate", Key: "serving"},
			"node.env":    {Kind: "env", Content: "NODE_NAME={{ .InstanceID }}\nROLE={{ .Vars.role }}\n", Mode: "0640"},
			"app.json":    {Kind: "json", Path: "conf/app.json", Content: `{"role":"{{ .Vars.role }}"}`},
			"ca.crt":      {Kind: "ca_bundle", Path: "pki/ca.crt"},
		},
	}
}

type env struct {
	shard *agenttest.Shard
	dir   string
	log   logr.Logger
	// agentEnv overrides agent settings for every agent started.
	agentEnv map[string]string
}

func newEnv(t *testing.T, tune ...func(*agenttest.Shard)) *env {
	t.Helper()
	log := testr.NewWithOptions(t, testr.Options{Verbosity: 0})
	s, err := agenttest.New(log)
	require.NoError(t, err)
	s.RepushInterval = 300 * time.Millisecond
	for _, f := range tune {
		f(s)
	}
	require.NoError(t, s.Start())
	t.Cleanup(s.Stop)
	return &env{shard: s, dir: t.TempDir(), log: log}
}

// start adds an instance and runs the agent in-process; the returned stop
// function cancels it and waits for a clean return.
func (e *env) start(t *testing.T, id string, tmpl srvconfig.Template, vars map[string]string) (config.Config, func()) {
	t.Helper()
	vals, err := e.shard.Add(agenttest.Instance{ID: id, Group: "workers", Template: tmpl, Vars: vars}, e.dir)
	require.NoError(t, err)
	m := map[string]string{config.EnvMetricsInterval: "200ms", config.EnvReconnectMin: "50ms", config.EnvReconnectMax: "300ms"}
	for _, kv := range vals {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	for k, v := range e.agentEnv {
		m[k] = v
	}
	cfg, err := config.Load(func(k string) (string, bool) { v, ok := m[k]; return v, ok })
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agentapp.Run(ctx, cfg, "test", e.log.WithName(id)) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("agent did not stop")
		}
	}
	t.Cleanup(stop)
	return cfg, stop
}

func (e *env) serverHash(t *testing.T, id string) string {
	t.Helper()
	_, h, err := e.shard.Agent.Files(context.Background(), agentapi.Ref{InstanceID: id, Tenant: agenttest.Tenant, Shard: agenttest.ShardID, Group: "workers"})
	require.NoError(t, err)
	return h
}

func (e *env) lastReport(id string) *nstancev1.HealthReport {
	rec, ok := e.shard.Health.Get(id)
	if !ok {
		return nil
	}
	return rec.Last
}

// waitConverged waits until the agent reports the server's current hash with
// every file present.
func (e *env) waitConverged(t *testing.T, id string, files int) *nstancev1.HealthReport {
	t.Helper()
	var r *nstancev1.HealthReport
	require.Eventually(t, func() bool {
		r = e.lastReport(id)
		return r != nil && r.ConfigHash != "" && r.ConfigHash == e.serverHash(t, id) && len(r.Files) == files
	}, 20*time.Second, 50*time.Millisecond)
	return r
}

func TestAgentEndToEnd(t *testing.T) {
	e := newEnv(t)
	cfg, stop := e.start(t, "node-a", template(), map[string]string{"role": "worker"})

	r := e.waitConverged(t, "node-a", 5)
	for _, f := range r.Files {
		require.Equal(t, nstancev1.FileState_FILE_STATE_OK, f.State, f.Path+": "+f.Message)
	}
	require.Greater(t, r.Uptime.AsDuration(), time.Duration(0))
	require.Greater(t, r.Memory.TotalBytes, uint64(0))
	require.NotEmpty(t, r.NetworkInterfaces)
	require.NotEmpty(t, r.Disks)
	require.Equal(t, "test", r.AgentVersion)

	// Identity: nonce gone, certificate stored for the agent key.
	_, err := os.Stat(filepath.Join(cfg.IdentityDir, identity.NonceFile))
	require.ErrorIs(t, err, fs.ErrNotExist)
	id, err := identity.Open(cfg.IdentityDir)
	require.NoError(t, err)
	tc, err := id.Certificate(time.Now())
	require.NoError(t, err)
	require.Equal(t, "node-a", tc.Leaf.Subject.CommonName)

	// Keys generated with the requested types; certificates chain to the CA and match the keys.
	ks, err := keys.NewStore(cfg.KeysDir, 0)
	require.NoError(t, err)
	names, err := ks.Names()
	require.NoError(t, err)
	require.Equal(t, []string{"bare", "kubelet", "serving"}, names)
	for _, c := range []struct {
		key, file, cn string
		usage         x509.ExtKeyUsage
	}{{"kubelet", "kubelet.crt", "node-a", x509.ExtKeyUsageClientAuth}, {"serving", "serving.crt", "serve", x509.ExtKeyUsageServerAuth}} {
		b, err := os.ReadFile(filepath.Join(cfg.FilesDir, c.file))
		require.NoError(t, err)
		blk, _ := pem.Decode(b)
		require.NotNil(t, blk)
		cert, err := x509.ParseCertificate(blk.Bytes)
		require.NoError(t, err)
		require.Equal(t, c.cn, cert.Subject.CommonName)
		// Template certificates come from the workload CA, never the cluster CA.
		_, err = cert.Verify(x509.VerifyOptions{Roots: e.shard.WorkloadCA.Pool(), KeyUsages: []x509.ExtKeyUsage{c.usage}})
		require.NoError(t, err)
		_, err = cert.Verify(x509.VerifyOptions{Roots: e.shard.CA.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		require.ErrorAs(t, err, new(x509.UnknownAuthorityError))
		require.Equal(t, []x509.ExtKeyUsage{c.usage}, cert.ExtKeyUsage)
		priv, err := ks.Load(c.key)
		require.NoError(t, err)
		require.True(t, priv.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(cert.PublicKey))
	}
	env, err := os.ReadFile(filepath.Join(cfg.FilesDir, "node.env"))
	require.NoError(t, err)
	require.Equal(t, "NODE_NAME=node-a\nROLE=worker\n", string(env))
	fi, err := os.Stat(filepath.Join(cfg.FilesDir, "node.env"))
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o640), fi.Mode().Perm())
	ca, err := os.ReadFile(filepath.Join(cfg.FilesDir, "pki", "ca.crt"))
	require.NoError(t, err)
	require.Equal(t, e.shard.WorkloadCA.CertPEM, ca, "ca_bundle without content is the workload CA")

	// Runtime config change: a new var is pushed with a new hash.
	oldHash := r.ConfigHash
	e.shard.SetVars("node-a", map[string]string{"role": "ingress"})
	r = e.waitConverged(t, "node-a", 5)
	require.NotEqual(t, oldHash, r.ConfigHash)
	b, err := os.ReadFile(filepath.Join(cfg.FilesDir, "conf", "app.json"))
	require.NoError(t, err)
	require.JSONEq(t, `{"role":"ingress"}`, string(b))

	// Server restart: fresh server state, the agent reconnects, re-submits
	// its keys (same keys, new certificates) and reports again.
	kubeletKey, err := os.ReadFile(ks.Path("kubelet"))
	require.NoError(t, err)
	e.shard.Stop()
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, e.shard.Start())
	e.waitConverged(t, "node-a", 5)
	again, err := os.ReadFile(ks.Path("kubelet"))
	require.NoError(t, err)
	require.Equal(t, kubeletKey, again, "keys survive reconnects")
	stored, err := e.shard.Keys.Keys(context.Background(), agentapi.Ref{InstanceID: "node-a"})
	require.NoError(t, err)
	require.Len(t, stored, 3)

	// Clean stop sends a final report, without a termination notice: the
	// agent stopping is not the VM going away.
	before, _ := e.shard.Health.Get("node-a")
	stop()
	after, ok := e.shard.Health.Get("node-a")
	require.True(t, ok)
	require.Greater(t, after.Reports, before.Reports)
	require.Nil(t, after.Last.GetTermination())
}

func TestUnsafeFilesRejectedAndReported(t *testing.T) {
	e := newEnv(t)
	e.agentEnv = map[string]string{config.EnvMaxFileSize: "1048576"} // the agent's own cap, below the server's
	outside := filepath.Join(e.dir, "outside")
	require.NoError(t, os.MkdirAll(outside, 0o755))
	tmpl := srvconfig.Template{Files: map[string]srvconfig.TemplateFile{
		"ok":       {Kind: "string", Path: "ok.txt", Content: "fine"},
		"absolute": {Kind: "string", Path: filepath.Join(outside, "abs.txt"), Content: "x"},
		"dotdot":   {Kind: "string", Path: "../outside/dotdot.txt", Content: "x"},
		"symlink":  {Kind: "string", Path: "link/evil.txt", Content: "x"},
		"big":      {Kind: "string", Path: "big.txt", Content: strings.Repeat("x", 2<<20)},
	}}
	// Plant the symlink before the agent starts: files dir/link -> outside.
	filesDir := filepath.Join(e.dir, "node-u", "files")
	require.NoError(t, os.MkdirAll(filesDir, 0o755))
	require.NoError(t, os.Symlink(outside, filepath.Join(filesDir, "link")))
	e.start(t, "node-u", tmpl, nil)

	r := e.waitConverged(t, "node-u", 5)
	got := map[string]*nstancev1.FileStatus{}
	for _, f := range r.Files {
		got[f.Path] = f
	}
	require.Equal(t, nstancev1.FileState_FILE_STATE_OK, got["ok.txt"].State)
	for p, want := range map[string]string{
		filepath.Join(outside, "abs.txt"): "absolute",
		"../outside/dotdot.txt":           `".."`,
		"link/evil.txt":                   "symbolic link",
		"big.txt":                         "byte limit",
	} {
		require.Contains(t, got, p)
		require.Equal(t, nstancev1.FileState_FILE_STATE_ERROR, got[p].State, p)
		require.Contains(t, got[p].Message, want, p)
	}
	ents, err := os.ReadDir(outside)
	require.NoError(t, err)
	require.Empty(t, ents, "nothing written outside the files directory")
	_, err = os.Stat(filepath.Join(filesDir, "big.txt"))
	require.True(t, errors.Is(err, fs.ErrNotExist))
	rec, _ := e.shard.Health.Get("node-u")
	require.Equal(t, 4, rec.FileErrors)
}

func TestDriftRepushesFiles(t *testing.T) {
	e := newEnv(t)
	tmpl := srvconfig.Template{Files: map[string]srvconfig.TemplateFile{"a": {Kind: "string", Path: "a.txt", Content: "one"}}}
	cfg, _ := e.start(t, "node-d", tmpl, nil)
	e.waitConverged(t, "node-d", 1)

	// Change the template without notifying: only the health report's hash
	// reveals the drift, and the server pushes the files again.
	tmpl.Files["a"] = srvconfig.TemplateFile{Kind: "string", Path: "a.txt", Content: "two"}
	e.shard.SetTemplate("node-d", tmpl, false)
	// The file stream learns the new desired hash on its next wake-up; a var
	// change on another instance does not wake it, so drift detection must.
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(filepath.Join(cfg.FilesDir, "a.txt"))
		return err == nil && string(b) == "two"
	}, 20*time.Second, 50*time.Millisecond)
	e.waitConverged(t, "node-d", 1)
}

// TestTemplateChangesRemoveDroppedFiles: over real mTLS, a file dropped from
// the template is removed from the instance (an empty directory with it); a
// certificate file stays while its certificate is re-issued after a server
// restart (it is pending, not dropped).
func TestTemplateChangesRemoveDroppedFiles(t *testing.T) {
	e := newEnv(t)
	full := template()
	full.Files["extra"] = srvconfig.TemplateFile{Kind: "string", Path: "old/extra.txt", Content: "bye"}
	cfg, _ := e.start(t, "node-r", full, map[string]string{"role": "worker"})
	e.waitConverged(t, "node-r", 6)
	extra := filepath.Join(cfg.FilesDir, "old", "extra.txt")
	_, err := os.Stat(extra)
	require.NoError(t, err)

	e.shard.SetTemplate("node-r", template(), true)
	e.waitConverged(t, "node-r", 5)
	_, err = os.Stat(extra)
	require.ErrorIs(t, err, fs.ErrNotExist, "a file dropped from the template is removed")
	_, err = os.Stat(filepath.Dir(extra))
	require.ErrorIs(t, err, fs.ErrNotExist, "and its directory, now empty")

	// A server restart forgets the issued certificates; until they are issued
	// again the certificate files are pending and stay on disk.
	crt := filepath.Join(cfg.FilesDir, "kubelet.crt")
	before, err := os.ReadFile(crt)
	require.NoError(t, err)
	var missing atomic.Bool
	watchDone, stopWatch := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watchDone)
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(time.Millisecond):
			}
			if _, err := os.Lstat(crt); err != nil {
				missing.Store(true)
			}
		}
	}()
	e.shard.Stop()
	require.NoError(t, e.shard.Start())
	e.waitConverged(t, "node-r", 5)
	close(stopWatch)
	<-watchDone
	require.False(t, missing.Load(), "the certificate file was never missing")
	after, err := os.ReadFile(crt)
	require.NoError(t, err)
	require.NotEqual(t, string(before), string(after), "re-issued")
}

// A file the agent could not write is reported in error, and the server
// pushes the files again (forced: their hash did not change) until it is
// written: once the symbolic link in its way is gone, the next push puts
// it in place.
func TestFilesInErrorArePushedAgain(t *testing.T) {
	e := newEnv(t)
	outside := filepath.Join(e.dir, "outside")
	require.NoError(t, os.MkdirAll(outside, 0o755))
	tmpl := srvconfig.Template{Files: map[string]srvconfig.TemplateFile{
		"ok":      {Kind: "string", Path: "ok.txt", Content: "fine"},
		"blocked": {Kind: "string", Path: "link/later.txt", Content: "written at last"},
	}}
	filesDir := filepath.Join(e.dir, "node-r", "files")
	require.NoError(t, os.MkdirAll(filesDir, 0o755))
	require.NoError(t, os.Symlink(outside, filepath.Join(filesDir, "link")))
	e.start(t, "node-r", tmpl, nil)
	require.Eventually(t, func() bool {
		r := e.lastReport("node-r")
		for _, f := range r.GetFiles() {
			if f.GetPath() == "link/later.txt" {
				return f.GetState() == nstancev1.FileState_FILE_STATE_ERROR
			}
		}
		return false
	}, 20*time.Second, 20*time.Millisecond, "the blocked file is reported in error")

	require.NoError(t, os.Remove(filepath.Join(filesDir, "link")))
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(filepath.Join(filesDir, "link", "later.txt"))
		return err == nil && string(b) == "written at last"
	}, 20*time.Second, 20*time.Millisecond, "pushed again and written")
	_, err := os.Stat(filepath.Join(outside, "later.txt"))
	require.True(t, os.IsNotExist(err), "never written through the link")
}
