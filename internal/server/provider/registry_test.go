package provider_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/provider/process"
	"github.com/nstance-dev/nstance/internal/server/provider/tmux"
)

// nestedOptions is a kind config with a nested block, to check field paths
// below the first level.
type nestedOptions struct {
	Name  string `json:"name"`
	Inner struct {
		N int `json:"n"`
	} `json:"inner"`
	Tags map[string]string `json:"tags"`
	// built records the env New was called with.
	built *provider.Env
}

func (o *nestedOptions) Validate(cfg *config.Config) config.Errors {
	if cfg.Shard.Infra.Region == "" {
		return config.Errors{{Key: "shard.infra.region", Reason: "required by the nested kind"}}
	}
	return nil
}

func (o *nestedOptions) New(_ context.Context, env provider.Env) (provider.Provider, error) {
	*o.built = env
	return mock.New(), nil
}

func registry(built *provider.Env) *provider.Registry {
	nested := provider.Kind{Name: "nested", Config: func() provider.KindConfig {
		return &nestedOptions{Name: "default-name", built: built}
	}}
	return provider.NewRegistry(tmux.Kind(), process.Kind(), mock.Kind(), nested)
}

func keys(t *testing.T, err error) []string {
	t.Helper()
	es, ok := config.AsErrors(err)
	require.True(t, ok, "want config.Errors, got %v", err)
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.Error()
	}
	return out
}

func TestRegistryNames(t *testing.T) {
	require.Equal(t, []string{"mock", "nested", "process", "tmux"}, registry(new(provider.Env)).Names())
}

func TestRegistryUnknownKind(t *testing.T) {
	_, err := registry(new(provider.Env)).Decode(infraConfig(config.Infra{Provider: "gce"}))
	require.Equal(t, []string{`shard.infra.provider: unknown provider "gce" (want one of mock, nested, process, tmux)`}, keys(t, err))
}

func TestRegistryRejectsBadBlocks(t *testing.T) {
	r := registry(new(provider.Env))
	tests := []struct {
		name  string
		infra config.Infra
		want  []string
	}{
		{"unknown key", config.Infra{Provider: "tmux", Options: map[string]any{"sesion": "x"}},
			[]string{"shard.infra.options.sesion: unknown key"}},
		{"wrong type", config.Infra{Provider: "process", Options: map[string]any{"command": 3.0, "state_dir": true}},
			[]string{"shard.infra.options.command: want string, got number", "shard.infra.options.state_dir: want string, got boolean"}},
		{"mock takes no options", config.Infra{Provider: "mock", Options: map[string]any{"command": "x"}},
			[]string{"shard.infra.options.command: unknown key"}},
		{"nested path", config.Infra{Provider: "nested", Region: "r", Options: map[string]any{"inner": map[string]any{"n": "one", "M": 1.0}, "tags": map[string]any{"a": 1.0}}},
			[]string{"shard.infra.options.inner.M: unknown key", "shard.infra.options.inner.n: want integer, got string", "shard.infra.options.tags.a: want string, got number"}},
		{"empty command", config.Infra{Provider: "tmux", Options: map[string]any{"command": " "}},
			[]string{"shard.infra.options.command: must not be empty (default air -c scripts/air/agent.toml)"}},
		{"bad session and no state dir", config.Infra{Provider: "tmux", Options: map[string]any{"session": "a:b", "state_dir": ""}},
			[]string{"shard.infra.options.state_dir: must not be empty (default temp/agents)", `shard.infra.options.session: must be a non-empty name without ':', '.' or '=', got "a:b"`}},
		{"kind checks the rest of infra", config.Infra{Provider: "nested"},
			[]string{"shard.infra.region: required by the nested kind"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.Decode(infraConfig(tc.infra))
			require.Equal(t, tc.want, keys(t, err))
		})
	}
}

func TestRegistryDefaults(t *testing.T) {
	r := registry(new(provider.Env))
	kc, err := r.Decode(infraConfig(config.Infra{Provider: "tmux"}))
	require.NoError(t, err)
	require.Equal(t, &tmux.Options{Command: "air -c scripts/air/agent.toml", Session: "nstance-dev-agents",
		StateDir: filepath.Join("temp", "agents"), NodeDir: filepath.Join("temp", "dev-k8s", "nodes")}, kc)

	// A partial block keeps the other defaults.
	kc, err = r.Decode(infraConfig(config.Infra{Provider: "process", Options: map[string]any{"node_dir": "-"}}))
	require.NoError(t, err)
	require.Equal(t, &process.Options{Command: "bin/nstance-agent", StateDir: filepath.Join("temp", "agents"), NodeDir: "-"}, kc)

	// Every decode starts from fresh defaults: an earlier block leaves no trace.
	kc, err = r.Decode(infraConfig(config.Infra{Provider: "process"}))
	require.NoError(t, err)
	require.Equal(t, "temp/dev-k8s/nodes", kc.(*process.Options).NodeDir)
}

func TestRegistryNewPassesEnvAndOverrides(t *testing.T) {
	var built provider.Env
	r := registry(&built)
	cfg := &config.Config{}
	cfg.Cluster.ID, cfg.Shard.ID = "c1", "s1"
	cfg.Shard.Infra = config.Infra{Provider: "nested", Region: "r1"}
	p, err := r.New(context.Background(), provider.Env{Config: func() *config.Config { return cfg }, Local: provider.Local{Command: "x"}, Log: logr.Discard()})
	require.NoError(t, err)
	require.IsType(t, &mock.Provider{}, p)
	require.Equal(t, "s1", built.Config().Shard.ID)
	require.Equal(t, "x", built.Local.Command)

	// The process kind: the command line's state dir replaces the block's.
	dir := t.TempDir()
	cfg.Shard.Infra = config.Infra{Provider: "process", Options: map[string]any{"state_dir": filepath.Join(dir, "from-config"), "node_dir": "-"}}
	_, err = r.New(context.Background(), provider.Env{Config: func() *config.Config { return cfg }, Local: provider.Local{StateDir: filepath.Join(dir, "from-flag")}})
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(dir, "from-flag"))
	require.NoError(t, err, "process provider made its state dir where the flag says")
	_, err = os.Stat(filepath.Join(dir, "from-config"))
	require.True(t, os.IsNotExist(err))

	cfg.Shard.Infra = config.Infra{Provider: "tmux", Options: map[string]any{"bogus": 1.0}}
	_, err = r.New(context.Background(), provider.Env{Config: func() *config.Config { return cfg }})
	require.Equal(t, []string{"shard.infra.options.bogus: unknown key"}, keys(t, err))
}

func TestRegistryDuplicateKindPanics(t *testing.T) {
	require.PanicsWithValue(t, `provider: kind "mock" registered twice`, func() { provider.NewRegistry(mock.Kind(), mock.Kind()) })
}

func TestConfigParseRunsRegistryCheck(t *testing.T) {
	doc := `{
  "cluster": {"id": "c1", "storage": {"kind": "s3", "bucket": "b"}},
  "shard": {"id": "s1",
    "infra": {"provider": "tmux", "region": "dev", "zone": "deva", "options": {"command": "", "sockt": "x"}},
    "bind": {"health_addr": "127.0.0.1:1", "election_addr": "127.0.0.1:2", "registration_addr": "127.0.0.1:3", "operator_addr": "127.0.0.1:4", "agent_addr": "bad"}}
}`
	_, err := config.Parse([]byte(doc), registry(new(provider.Env)).Check)
	got := strings.Join(keys(t, err), "\n")
	require.Contains(t, got, "shard.bind.agent_addr", "the document's own problems are still reported")
	require.Contains(t, got, "shard.infra.options.sockt: unknown key")

	// Without the check the same options block is accepted: only the
	// registry knows the kind's schema.
	_, err = config.Parse([]byte(strings.Replace(doc, `"bad"`, `"127.0.0.1:5"`, 1)))
	require.NoError(t, err)
	_, err = config.Parse([]byte(strings.Replace(doc, `"bad"`, `"127.0.0.1:5"`, 1)), registry(new(provider.Env)).Check)
	require.Equal(t, []string{"shard.infra.options.sockt: unknown key"}, keys(t, err))
}

func infraConfig(infra config.Infra) *config.Config {
	cfg := &config.Config{}
	cfg.Shard.Infra = infra
	return cfg
}
