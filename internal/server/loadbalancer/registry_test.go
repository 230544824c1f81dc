package loadbalancer_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/loadbalancer"
)

// testSettings is a kind with a nested block, to check strict decoding and
// the paths in its errors.
type testSettings struct {
	Backend string          `json:"backend"`
	Delay   config.Duration `json:"delay"`
	Inner   struct {
		N int `json:"n"`
	} `json:"inner"`
}

func (s *testSettings) Validate(_ *config.Config, key string) config.Errors {
	if s.Backend == "" {
		return config.Errors{{Key: key + ".backend", Reason: "required"}}
	}
	return nil
}

func (s *testSettings) New(_ context.Context, env loadbalancer.Env) (loadbalancer.Provider, error) {
	return &named{name: env.Name, settings: *s}, nil
}

type named struct {
	loadbalancer.Provider
	name     string
	settings testSettings
}

func kind() loadbalancer.Kind {
	return loadbalancer.Kind{Name: "test", Config: func() loadbalancer.KindConfig {
		return &testSettings{Delay: config.Duration(5 * time.Second)}
	}}
}

const doc = `{
  "cluster": {"id": "c1"},
  "shard": {"id": "s1", "infra": {"provider": "mock"},
    "bind": {"health_addr": "127.0.0.1:0", "election_addr": "127.0.0.1:0",
      "registration_addr": "127.0.0.1:0", "operator_addr": "127.0.0.1:0", "agent_addr": "127.0.0.1:0"}},
  "load_balancers": LBS,
  "templates": {"t": {"kind": "worker"}},
}`

func TestRegistry(t *testing.T) {
	r := loadbalancer.NewRegistry(kind())
	require.Equal(t, []string{"test"}, r.Names())
	require.Panics(t, func() { loadbalancer.NewRegistry(kind(), kind()) })

	parse := func(lbs string) (*config.Config, error) {
		return config.Parse([]byte(strings.Replace(doc, "LBS", lbs, 1)), r.Check)
	}
	cfg, err := parse(`{"www": {"provider": "test", "backend": "b1", "inner": {"n": 2}}, "api": {"provider": "test", "backend": "b2", "delay": "1s"}}`)
	require.NoError(t, err)
	ps, err := r.NewAll(context.Background(), loadbalancer.Env{Config: func() *config.Config { return cfg }, Log: logr.Discard()})
	require.NoError(t, err)
	require.Len(t, ps, 2)
	www := ps["www"].(*named)
	require.Equal(t, "www", www.name)
	require.Equal(t, testSettings{Backend: "b1", Delay: config.Duration(5 * time.Second), Inner: struct {
		N int `json:"n"`
	}{N: 2}}, www.settings, "defaults kept where the entry is silent")
	require.Equal(t, config.Duration(time.Second), ps["api"].(*named).settings.Delay)

	for _, c := range []struct{ lbs, want string }{
		{`{"www": {"provider": "nope"}}`, `load_balancers.www.provider: unknown load balancer provider "nope" (want one of test)`},
		{`{"www": {"provider": "test", "backend": "b", "bakend": "x"}}`, `load_balancers.www.bakend: unknown key`},
		{`{"www": {"provider": "test", "backend": "b", "inner": {"n": "two"}}}`, `load_balancers.www.inner.n: want`},
		{`{"www": {"provider": "test", "backend": "b", "delay": "soon"}}`, `load_balancers.www.delay: invalid duration`},
		{`{"www": {"provider": "test"}}`, `load_balancers.www.backend: required`},
	} {
		_, err := parse(c.lbs)
		require.ErrorContains(t, err, c.want, c.lbs)
	}
	_, err = r.New(context.Background(), loadbalancer.Env{Name: "gone", Config: func() *config.Config { return cfg }})
	require.ErrorContains(t, err, "load_balancers.gone: no such load balancer")
}
