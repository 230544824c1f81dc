package groups_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/server/cache"
	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

func testConfig() *config.Config {
	return &config.Config{
		Shard: config.Shard{ID: "s1", DefaultDrainTimeout: config.Duration(time.Minute),
			SubnetPools: map[string]config.SubnetPool{"a": {Subnets: []string{"x"}}, "b": {Subnets: []string{"y"}}}},
		Defaults: config.Defaults{Vars: map[string]string{"env": "dev", "role": "none"}, Args: map[string]string{"v": "1"}},
		Templates: map[string]config.Template{
			"worker": {InstanceType: "small", SubnetPool: "a", Vars: map[string]string{"role": "worker", "t": "1"}},
		},
		Groups: map[string]map[string]config.Group{"acme": {"static": {Template: "worker", Size: 2}}},
	}
}

func TestResolveMergesInOrder(t *testing.T) {
	cfg := testConfig()
	tests := []struct {
		name string
		spec *groups.Spec
		o    groups.Overrides
		want groups.Effective
		err  string
	}{
		{"template only", nil, groups.Overrides{Template: "worker"}, groups.Effective{Template: "worker", InstanceType: "small", SubnetPool: "a",
			Vars: map[string]string{"env": "dev", "role": "worker", "t": "1"}, Args: map[string]string{"v": "1"}, DrainTimeout: time.Minute}, ""},
		{"group over template", &groups.Spec{Template: "worker", InstanceType: "big", SubnetPool: "b", Vars: map[string]string{"role": "db"}, DrainTimeout: new(time.Second)},
			groups.Overrides{}, groups.Effective{Template: "worker", InstanceType: "big", SubnetPool: "b",
				Vars: map[string]string{"env": "dev", "role": "db", "t": "1"}, Args: map[string]string{"v": "1"}, DrainTimeout: time.Second}, ""},
		{"request over group", &groups.Spec{Template: "worker", Vars: map[string]string{"role": "db"}},
			groups.Overrides{InstanceType: "huge", Vars: map[string]string{"role": "gpu"}, DrainTimeout: new(time.Hour)},
			groups.Effective{Template: "worker", InstanceType: "huge", SubnetPool: "a",
				Vars: map[string]string{"env": "dev", "role": "gpu", "t": "1"}, Args: map[string]string{"v": "1"}, DrainTimeout: time.Hour}, ""},
		{"group image as the reserved arg", &groups.Spec{Template: "worker", Image: "ami-2"}, groups.Overrides{},
			groups.Effective{Template: "worker", InstanceType: "small", SubnetPool: "a",
				Vars: map[string]string{"env": "dev", "role": "worker", "t": "1"}, Args: map[string]string{"v": "1", "image": "ami-2"}, DrainTimeout: time.Minute}, ""},
		{"group drain 0: no drain", &groups.Spec{Template: "worker", DrainTimeout: new(time.Duration(0))}, groups.Overrides{},
			groups.Effective{Template: "worker", InstanceType: "small", SubnetPool: "a",
				Vars: map[string]string{"env": "dev", "role": "worker", "t": "1"}, Args: map[string]string{"v": "1"}}, ""},
		{"request drain 0 over the group's", &groups.Spec{Template: "worker", DrainTimeout: new(time.Hour)}, groups.Overrides{DrainTimeout: new(time.Duration(0))},
			groups.Effective{Template: "worker", InstanceType: "small", SubnetPool: "a",
				Vars: map[string]string{"env": "dev", "role": "worker", "t": "1"}, Args: map[string]string{"v": "1"}}, ""},
		{"request drain over the group's 0", &groups.Spec{Template: "worker", DrainTimeout: new(time.Duration(0))}, groups.Overrides{DrainTimeout: new(time.Hour)},
			groups.Effective{Template: "worker", InstanceType: "small", SubnetPool: "a",
				Vars: map[string]string{"env": "dev", "role": "worker", "t": "1"}, Args: map[string]string{"v": "1"}, DrainTimeout: time.Hour}, ""},
		{"no template", nil, groups.Overrides{}, groups.Effective{}, "template: required"},
		{"unknown template", nil, groups.Overrides{Template: "x"}, groups.Effective{}, "unknown template"},
		{"unknown pool", nil, groups.Overrides{Template: "worker", SubnetPool: "zz"}, groups.Effective{}, "unknown subnet pool"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := groups.Resolve(cfg, tc.spec, tc.o)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestRegistryPersistsAndProtectsStatic(t *testing.T) {
	ctx := context.Background()
	store := memstore.New()
	r := groups.NewRegistry(store, layout.New(""), "s1")
	changed := r.SetStatic(testConfig())
	require.Equal(t, []groups.Key{{Tenant: "acme", ID: "static"}}, changed)
	require.Empty(t, r.SetStatic(testConfig()), "same config, no change")
	_, err := r.Load(ctx)
	require.NoError(t, err)

	_, _, err = r.Upsert(ctx, groups.Key{Tenant: "acme", ID: "static"}, groups.Spec{Template: "worker"}, "")
	require.ErrorIs(t, err, groups.ErrStatic)
	g, created, err := r.Upsert(ctx, groups.Key{Tenant: "acme", ID: "web"}, groups.Spec{Template: "worker", Size: 3}, "")
	require.NoError(t, err)
	require.True(t, created)
	_, _, err = r.Upsert(ctx, groups.Key{Tenant: "acme", ID: "web"}, groups.Spec{Template: "worker", Size: 4}, "d-wrong")
	require.ErrorIs(t, err, groups.ErrETag)
	g2, created, err := r.Upsert(ctx, groups.Key{Tenant: "acme", ID: "web"}, groups.Spec{Template: "worker", Size: 4}, g.ETag)
	require.NoError(t, err)
	require.False(t, created)
	require.NotEqual(t, g.ETag, g2.ETag)
	_, _, err = r.Upsert(ctx, groups.Key{Tenant: "globex", ID: "web"}, groups.Spec{Template: "worker", Size: 1}, "")
	require.NoError(t, err)

	// Another registry (a restarted server) reads the same groups back.
	r2 := groups.NewRegistry(store, layout.New(""), "s1")
	_, err = r2.Load(ctx)
	require.NoError(t, err)
	got, ok := r2.Get(groups.Key{Tenant: "acme", ID: "web"})
	require.True(t, ok)
	require.Equal(t, 4, got.Spec.Size)
	require.Len(t, r2.List("acme"), 1, "static groups come from config, not storage")
	require.Len(t, r2.List("globex"), 1)

	// A write by the other registry is seen by the first despite its cache.
	_, err = r2.Delete(ctx, groups.Key{Tenant: "acme", ID: "web"}, "")
	require.NoError(t, err)
	_, _, err = r.Upsert(ctx, groups.Key{Tenant: "acme", ID: "web"}, groups.Spec{Template: "worker", Size: 9}, g2.ETag)
	require.ErrorIs(t, err, groups.ErrETag, "etag checked against storage, not a stale cache")
	_, err = r.Delete(ctx, groups.Key{Tenant: "acme", ID: "web"}, "")
	require.ErrorIs(t, err, groups.ErrNotFound)

	// A hand-edited JSONC document with comments loads; a torn one is an error, not a crash.
	_, err = store.Put(ctx, layout.New("").Groups("s1"), []byte("{ // edited\n \"version\": 1, \"tenants\": {\"t\": {\"g\": {\"spec\": {\"template\": \"worker\", \"size\": 1}, \"etag\": \"x\",},},}, }"), objstore.PutOptions{})
	require.NoError(t, err)
	_, err = r2.Load(ctx)
	require.NoError(t, err)
	_, ok = r2.Get(groups.Key{Tenant: "t", ID: "g"})
	require.True(t, ok)
	_, err = store.Put(ctx, layout.New("").Groups("s1"), []byte("{\"tenants\": "), objstore.PutOptions{})
	require.NoError(t, err)
	_, err = r2.Load(ctx)
	require.Error(t, err)
	_, ok = r2.Get(groups.Key{Tenant: "t", ID: "g"})
	require.True(t, ok, "last good groups kept")
}

func TestValidate(t *testing.T) {
	cfg := testConfig()
	require.Empty(t, groups.Validate(cfg, "acme", "web", groups.Spec{Template: "worker", Size: 1}))
	require.Empty(t, groups.Validate(cfg, "acme", "web", groups.Spec{Template: "worker", Size: 1, Image: "ami-0123456789abcdef0"}))
	fes := groups.Validate(cfg, "acme", "../x", groups.Spec{Template: "nope", Size: -1, SubnetPool: "zz", Image: "two words"})
	var keys []string
	for _, fe := range fes {
		keys = append(keys, fe.Key)
	}
	require.ElementsMatch(t, []string{"group_id", "template", "size", "subnet_pool", "image"}, keys)
}

func TestValidateRefusesControlPlaneNamesInVars(t *testing.T) {
	cfg := testConfig()
	cfg.Cluster.ID = "c1"
	cfg.Shard.Advertise.Hosts = []string{"nstance.example.com"}
	t1 := cfg.Templates["worker"]
	t1.Keys = map[string]config.TemplateKey{"tls": {Type: "ed25519", Certificate: &config.TemplateCertificate{
		CommonName: "{{ .InstanceID }}", DNSNames: []string{"{{ .Vars.dns }}"}, URIs: []string{"{{ .Vars.uri }}"}}}}
	cfg.Templates["worker"] = t1
	ok := groups.Spec{Template: "worker", Vars: map[string]string{"dns": "web.example.com", "uri": "spiffe://apps/web"}}
	require.Empty(t, groups.Validate(cfg, "acme", "web", ok))
	for name, vars := range map[string]map[string]string{
		"operator URI":    {"dns": "web.example.com", "uri": "spiffe://c1/tenant/acme/operator/op-1"},
		"server DNS name": {"dns": "nstance.example.com", "uri": "spiffe://apps/web"},
		"loopback":        {"dns": "localhost", "uri": "spiffe://apps/web"},
	} {
		fes := groups.Validate(cfg, "acme", "web", groups.Spec{Template: "worker", Vars: vars})
		require.Len(t, fes, 1, name)
		require.Equal(t, "vars", fes[0].Key, name)
		require.Contains(t, fes[0].Reason, "templates.worker.keys.tls.certificate.", name)
	}
}

// TestLoadCachedThenWriteOverStaleDocument: groups installed from a stale
// cached document are served at once; a write starting from them fails
// its condition, re-reads storage and keeps the other writer's group; Load
// and every write keep the cache equal to storage.
func TestLoadCachedThenWriteOverStaleDocument(t *testing.T) {
	ctx := context.Background()
	obj := memstore.New()
	keys := layout.New("")
	db, err := cache.Open(ctx, "")
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	m := groups.CacheMirror{Cache: db, Key: keys.Groups("s1")}

	r := groups.NewRegistry(obj, keys, "s1")
	_, ok, err := r.LoadCached(ctx)
	require.NoError(t, err)
	require.False(t, ok, "no mirror, nothing loaded")
	r.SetMirror(m)
	_, ok, err = r.LoadCached(ctx)
	require.NoError(t, err)
	require.False(t, ok, "a cache never synced is not used")
	_, err = db.Rebuild(ctx, obj, []cache.Source{{Kind: cache.KindGroups, Key: keys.Groups("s1")},
		{Kind: cache.KindTenantGroups, Prefix: keys.TenantGroupsPrefix("s1")}}, time.Now())
	require.NoError(t, err)
	_, err = r.Load(ctx)
	require.NoError(t, err)
	_, _, err = r.Upsert(ctx, groups.Key{Tenant: "acme", ID: "a"}, groups.Spec{Template: "worker", Size: 1}, "")
	require.NoError(t, err)

	// Another leader adds b; this server's cache still has only a.
	other := groups.NewRegistry(obj, keys, "s1")
	_, _, err = other.Upsert(ctx, groups.Key{Tenant: "acme", ID: "b"}, groups.Spec{Template: "worker", Size: 2}, "")
	require.NoError(t, err)

	next := groups.NewRegistry(obj, keys, "s1")
	next.SetMirror(m)
	changed, ok, err := next.LoadCached(ctx)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, []groups.Key{{Tenant: "acme", ID: "a"}}, changed, "the cached view")
	_, _, err = next.Upsert(ctx, groups.Key{Tenant: "acme", ID: "c"}, groups.Spec{Template: "worker", Size: 3}, "")
	require.NoError(t, err)
	var ids []string
	for _, g := range next.List("acme") {
		ids = append(ids, g.ID)
	}
	require.Equal(t, []string{"a", "b", "c"}, ids, "b kept: the stale write re-read storage")
	stored, err := obj.Get(ctx, keys.TenantGroups("s1", "acme"))
	require.NoError(t, err)
	cached, err := db.Get(ctx, cache.KindTenantGroups, keys.TenantGroups("s1", "acme"))
	require.NoError(t, err)
	require.Equal(t, stored.ETag, cached.ETag)
	require.Equal(t, stored.Body, cached.Body)
}

// A static group's drain_timeout "0s" reaches its spec as 0 (no drain),
// distinct from an unset one (the shard's default); a shard without a
// default drains for FallbackDrainTimeout.
func TestStaticDrainTimeoutZeroIsNotUnset(t *testing.T) {
	cfg := testConfig()
	var nodrain, def config.Group
	require.NoError(t, json.Unmarshal([]byte(`{"template": "worker", "drain_timeout": "0s"}`), &nodrain))
	require.NoError(t, json.Unmarshal([]byte(`{"template": "worker"}`), &def))
	cfg.Groups = map[string]map[string]config.Group{"t": {"nodrain": nodrain, "default": def}}
	r := groups.NewRegistry(memstore.New(), layout.New(""), "s1")
	r.SetStatic(cfg)
	g, ok := r.Get(groups.Key{Tenant: "t", ID: "nodrain"})
	require.True(t, ok)
	require.NotNil(t, g.SpecProto().GetDrainTimeout())
	eff, err := groups.Resolve(cfg, &g.Spec, groups.Overrides{})
	require.NoError(t, err)
	require.Zero(t, eff.DrainTimeout)
	g, ok = r.Get(groups.Key{Tenant: "t", ID: "default"})
	require.True(t, ok)
	require.Nil(t, g.SpecProto().GetDrainTimeout())
	eff, err = groups.Resolve(cfg, &g.Spec, groups.Overrides{})
	require.NoError(t, err)
	require.Equal(t, time.Minute, eff.DrainTimeout, "the shard's default")
	cfg.Shard.DefaultDrainTimeout = 0
	eff, err = groups.Resolve(cfg, &g.Spec, groups.Overrides{})
	require.NoError(t, err)
	require.Equal(t, groups.FallbackDrainTimeout, eff.DrainTimeout)
}
