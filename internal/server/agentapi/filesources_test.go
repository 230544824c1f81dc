package agentapi_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/internal/server/agentapi"
	"github.com/nstance-dev/nstance/internal/server/agentlive"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// fakeRemote stands in for AWS: values by secret id or parameter name,
// rotated with put; fail makes every read fail.
type fakeRemote struct {
	mu     sync.Mutex
	values map[string]string
	fail   error
	calls  int
	last   secrets.Source
}

func (f *fakeRemote) put(name, v string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.values[name] = v
}

func (f *fakeRemote) setFail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = err
}

func (f *fakeRemote) Fetch(_ context.Context, src secrets.Source) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.last = src
	if f.fail != nil {
		return nil, f.fail
	}
	name := src.SecretID + src.Parameter
	v, ok := f.values[name]
	if !ok {
		return nil, fmt.Errorf("secrets manager: secret %q: not found", name)
	}
	return []byte(v), nil
}

func (f *fakeRemote) count() int { f.mu.Lock(); defer f.mu.Unlock(); return f.calls }

type fileEnv struct {
	objects *memstore.Store
	store   *secrets.Store
	keys    layout.Keys
	remote  *fakeRemote
	now     time.Time
	src     *agentapi.TemplateSource
	tmpl    config.Template
}

func (e *fileEnv) advance(d time.Duration) { e.now = e.now.Add(d) }

func newFileEnv(t *testing.T, files map[string]config.TemplateFile) *fileEnv {
	t.Helper()
	k, err := secrets.ParseKey([]byte("agentapi-file-sources-key-32byte"))
	require.NoError(t, err)
	ring, err := secrets.NewKeyring(k)
	require.NoError(t, err)
	e := &fileEnv{objects: memstore.New(), keys: layout.New("pre"), remote: &fakeRemote{values: map[string]string{}},
		now: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC), tmpl: config.Template{Files: files}}
	e.store = &secrets.Store{Objects: e.objects, Ring: ring}
	fs := &agentapi.FileSources{Secrets: e.store, Objects: e.objects, Keys: e.keys, Remote: e.remote, MaxBytes: 64,
		Settings: func() config.FileSources {
			return config.FileSources{CacheTTL: config.Duration(5 * time.Minute), MaxStale: config.Duration(time.Hour)}
		},
		Now: func() time.Time { return e.now }, Log: logr.Discard()}
	e.src = &agentapi.TemplateSource{Secret: fs.Secret, Storage: fs.Object,
		Lookup: func(context.Context, agentapi.Ref) (*agentapi.TemplateInput, error) {
			return &agentapi.TemplateInput{Template: e.tmpl, Data: agentapi.TemplateData{InstanceID: "i-1", Vars: map[string]string{"role": "web"}}}, nil
		}}
	return e
}

func (e *fileEnv) plan(t *testing.T) map[string]agentapi.FileSpec {
	t.Helper()
	p, err := e.src.Plan(context.Background(), agentapi.Ref{InstanceID: "i-1"})
	require.NoError(t, err, "a source failure never fails the plan")
	out := map[string]agentapi.FileSpec{}
	for _, f := range p.Files {
		out[f.Path] = f
	}
	return out
}

func TestPlanSecretFromClusterStore(t *testing.T) {
	e := newFileEnv(t, map[string]config.TemplateFile{
		"db":    {Kind: "secret", Path: "db.pw", Secret: "db-password"},
		"loose": {Kind: "secret", Path: "loose.pw", Secret: "db-password", Mode: "0644"},
		"gone":  {Kind: "secret", Path: "gone.pw", Secret: "missing"},
		"plain": {Kind: "string", Path: "plain.txt", Content: "role={{ .Vars.role }}"},
	})
	ctx := context.Background()
	require.NoError(t, e.store.Put(ctx, e.keys.FileSecret("db-password"), []byte("s3cr3t"), objstore.PutOptions{}))
	files := e.plan(t)
	require.Equal(t, "s3cr3t", string(files["db.pw"].Content))
	require.Equal(t, nstancev1.FileKind_FILE_KIND_SECRET, files["db.pw"].Kind)
	require.Equal(t, uint32(0o600), files["db.pw"].Mode, "secrets default to 0600")
	require.Equal(t, uint32(0o600), files["loose.pw"].Mode, "a looser mode is capped")
	require.NoError(t, files["db.pw"].Err)
	require.ErrorContains(t, files["gone.pw"].Err, `files.gone (gone.pw): file secret "missing" does not exist (pre/cluster/secret/files/missing`)
	require.Nil(t, files["gone.pw"].Content)
	require.Equal(t, "role=web", string(files["plain.txt"].Content), "other files are unaffected")

	// The envelope is bound to its key: one copied to another name does not open.
	obj, err := e.objects.Get(ctx, e.keys.FileSecret("db-password"))
	require.NoError(t, err)
	_, err = e.objects.Put(ctx, e.keys.FileSecret("missing"), obj.Body, objstore.PutOptions{})
	require.NoError(t, err)
	e.advance(11 * time.Second) // past the retry interval of the failure
	require.ErrorContains(t, e.plan(t)["gone.pw"].Err, "decryption failed")

	// Created later, it is delivered on the next plan after the retry interval.
	require.NoError(t, e.store.Put(ctx, e.keys.FileSecret("missing"), []byte("now here"), objstore.PutOptions{}))
	require.Error(t, e.plan(t)["gone.pw"].Err, "a failure is remembered for the retry interval")
	e.advance(11 * time.Second)
	files = e.plan(t)
	require.NoError(t, files["gone.pw"].Err)
	require.Equal(t, "now here", string(files["gone.pw"].Content))

	// Too large for shard.limits.max_file_bytes.
	require.NoError(t, e.store.Put(ctx, e.keys.FileSecret("big"), make([]byte, 65), objstore.PutOptions{}))
	e.tmpl.Files["big"] = config.TemplateFile{Kind: "secret", Path: "big", Secret: "big"}
	require.ErrorContains(t, e.plan(t)["big"].Err, "more than shard.limits.max_file_bytes (64)")
}

func TestPlanSecretFromAWSCachedAndRotated(t *testing.T) {
	e := newFileEnv(t, map[string]config.TemplateFile{
		"api": {Kind: "secret", Path: "api.key", Source: "aws-secrets-manager", SecretID: "prod/api", VersionStage: "AWSCURRENT", Region: "eu-west-1"},
		"tok": {Kind: "secret", Path: "tok", Source: "aws-ssm", Parameter: "/prod/token", Mode: "0400"},
	})
	e.remote.put("prod/api", "v1")
	e.remote.put("/prod/token", "t1")
	files := e.plan(t)
	require.Equal(t, "v1", string(files["api.key"].Content))
	require.Equal(t, "t1", string(files["tok"].Content))
	require.Equal(t, uint32(0o400), files["tok"].Mode)
	require.Equal(t, 2, e.remote.count())

	// Within the TTL nothing is read again, even after a rotation.
	e.remote.put("prod/api", "v2")
	for range 5 {
		e.advance(time.Minute - time.Second)
		require.Equal(t, "v1", string(e.plan(t)["api.key"].Content))
	}
	require.Equal(t, 2, e.remote.count(), "cached for cache_ttl")
	// Past the TTL the rotated value arrives.
	e.advance(10 * time.Second)
	files = e.plan(t)
	require.Equal(t, "v2", string(files["api.key"].Content))
	require.NoError(t, files["api.key"].Warn)
	require.Equal(t, 4, e.remote.count())

	// AWS fails: the last value is served, marked stale, until max_stale.
	e.remote.setFail(errors.New("AccessDeniedException: not authorized"))
	e.advance(6 * time.Minute)
	files = e.plan(t)
	require.Equal(t, "v2", string(files["api.key"].Content))
	require.ErrorContains(t, files["api.key"].Warn, "files.api (api.key): reading it again failed, delivering the value read at 2026-11-01T12:")
	require.ErrorContains(t, files["api.key"].Warn, "AccessDeniedException")
	calls := e.remote.count()
	e.advance(5 * time.Second)
	e.plan(t)
	require.Equal(t, calls, e.remote.count(), "a failure is not retried at once")
	e.advance(55 * time.Minute)
	files = e.plan(t)
	require.Nil(t, files["api.key"].Content)
	require.ErrorContains(t, files["api.key"].Err, "older than shard.file_sources.max_stale (1h0m0s)")

	// It recovers.
	e.remote.setFail(nil)
	e.remote.put("prod/api", "v3")
	e.advance(11 * time.Second)
	files = e.plan(t)
	require.Equal(t, "v3", string(files["api.key"].Content))
	require.NoError(t, files["api.key"].Err)
	require.NoError(t, files["api.key"].Warn)
}

func TestPlanStorageObject(t *testing.T) {
	e := newFileEnv(t, map[string]config.TemplateFile{
		"conf": {Kind: "storage", Path: "app.conf", Object: "files/app.conf"},
		"tmpl": {Kind: "storage", Path: "role.conf", Object: "files/role.tmpl", Template: true, Mode: "0640"},
		"gone": {Kind: "storage", Path: "gone", Object: "files/none"},
		"ca":   {Kind: "storage", Path: "ca.key", Object: "cluster/secret/ca.key"},
		"rec":  {Kind: "storage", Path: "rec", Object: "shard/s1/instances/i-2.json"},
	})
	ctx := context.Background()
	_, err := e.objects.Put(ctx, e.keys.Object("files/app.conf"), []byte("listen={{ .Vars.role }}"), objstore.PutOptions{})
	require.NoError(t, err)
	_, err = e.objects.Put(ctx, e.keys.Object("files/role.tmpl"), []byte("role={{ .Vars.role }} id={{ .InstanceID }}"), objstore.PutOptions{})
	require.NoError(t, err)
	_, err = e.objects.Put(ctx, e.keys.CAKey(), []byte("sealed"), objstore.PutOptions{})
	require.NoError(t, err)
	files := e.plan(t)
	require.Equal(t, "listen={{ .Vars.role }}", string(files["app.conf"].Content), "not rendered unless template is set")
	require.Equal(t, uint32(0), files["app.conf"].Mode, "storage files take the agent's default mode")
	require.Equal(t, nstancev1.FileKind_FILE_KIND_STRING, files["app.conf"].Kind)
	require.Equal(t, "role=web id=i-1", string(files["role.conf"].Content))
	require.Equal(t, uint32(0o640), files["role.conf"].Mode)
	require.ErrorContains(t, files["gone"].Err, `object "files/none" does not exist`)
	require.ErrorContains(t, files["ca.key"].Err, "Nstance's own state")
	require.Nil(t, files["ca.key"].Content)
	require.ErrorContains(t, files["rec"].Err, "Nstance's own state")

	// A change reaches the plan after the TTL; an unchanged object is not downloaded again.
	_, err = e.objects.Put(ctx, e.keys.Object("files/app.conf"), []byte("v2"), objstore.PutOptions{})
	require.NoError(t, err)
	require.Equal(t, "listen={{ .Vars.role }}", string(e.plan(t)["app.conf"].Content))
	e.advance(6 * time.Minute)
	require.Equal(t, "v2", string(e.plan(t)["app.conf"].Content))

	// A template that fails to render is that file's error only.
	_, err = e.objects.Put(ctx, e.keys.Object("files/role.tmpl"), []byte("{{ .Nope"), objstore.PutOptions{})
	require.NoError(t, err)
	e.advance(6 * time.Minute)
	files = e.plan(t)
	require.ErrorContains(t, files["role.conf"].Err, `rendering object "files/role.tmpl"`)
	require.Equal(t, "v2", string(files["app.conf"].Content))

	// Grown beyond max_file_bytes: like any failed re-read, the last good
	// value is delivered, marked stale; a new file that large is refused.
	_, err = e.objects.Put(ctx, e.keys.Object("files/app.conf"), make([]byte, 100), objstore.PutOptions{})
	require.NoError(t, err)
	e.advance(6 * time.Minute)
	files = e.plan(t)
	require.Equal(t, "v2", string(files["app.conf"].Content))
	require.ErrorContains(t, files["app.conf"].Warn, "more than shard.limits.max_file_bytes (64)")
	e.tmpl.Files["big"] = config.TemplateFile{Kind: "storage", Path: "big", Object: "files/app.conf"}
	e.tmpl.Files["big2"] = config.TemplateFile{Kind: "storage", Path: "big2", Object: "files/big"}
	_, err = e.objects.Put(ctx, e.keys.Object("files/big"), make([]byte, 65), objstore.PutOptions{})
	require.NoError(t, err)
	require.ErrorContains(t, e.plan(t)["big2"].Err, `object "files/big" is 65 bytes, more than shard.limits.max_file_bytes (64)`)
}

// A file whose source fails is left pending in the delivery (the agent
// keeps what it holds there) and the other files are delivered.
func TestDeliveryLeavesFailedSourcesPending(t *testing.T) {
	e := newFileEnv(t, map[string]config.TemplateFile{
		"gone":  {Kind: "secret", Path: "gone.pw", Secret: "missing"},
		"plain": {Kind: "string", Path: "plain.txt", Content: "x"},
	})
	srv, err := agentapi.New(agentapi.Options{Shard: "s1", Source: e.src, Keys: agentapi.NewMemKeyStore(), Signer: &agentapi.WorkloadSigner{},
		Live: agentlive.New(), Log: logr.Discard()})
	require.NoError(t, err)
	d, err := srv.Delivery(context.Background(), agentapi.Ref{InstanceID: "i-1"})
	require.NoError(t, err)
	require.Len(t, d.GetFiles(), 1)
	require.Equal(t, "plain.txt", d.GetFiles()[0].GetPath())
	require.Equal(t, []string{"gone.pw"}, d.GetPendingPaths())
}

// Many instances planned at once read a source once.
func TestFileSourcesReadOncePerSource(t *testing.T) {
	e := newFileEnv(t, map[string]config.TemplateFile{
		"api": {Kind: "secret", Path: "api.key", Source: "aws-secrets-manager", SecretID: "prod/api"},
	})
	e.remote.put("prod/api", "v1")
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			p, err := e.src.Plan(context.Background(), agentapi.Ref{InstanceID: "i-1"})
			if err == nil && string(p.Files[0].Content) != "v1" {
				err = fmt.Errorf("got %q", p.Files[0].Content)
			}
			require.NoError(t, err)
		})
	}
	wg.Wait()
	require.Equal(t, 1, e.remote.count())
	require.Equal(t, "prod/api", e.remote.last.SecretID)
}
