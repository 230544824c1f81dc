package mock

import (
	"context"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
)

// KindName selects this provider in shard.infra.provider.
const KindName = "mock"

// Options is shard.infra.options of the mock kind: it takes none.
type Options struct{}

// Kind registers the mock provider.
func Kind() provider.Kind {
	return provider.Kind{Name: KindName, Config: func() provider.KindConfig { return &Options{} }}
}

// Validate implements provider.KindConfig.
func (*Options) Validate(*config.Config) config.Errors { return nil }

// New implements provider.KindConfig.
func (*Options) New(context.Context, provider.Env) (provider.Provider, error) { return New(), nil }
