package reconcile

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/config"
)

// TestTuningPrecedence: options (tests) win over the live shard config, which
// wins over the defaults; a refreshed config is read on the next use.
func TestTuningPrecedence(t *testing.T) {
	type tuning struct {
		misses int
		grace  time.Duration
		surge  int
	}
	cases := []struct {
		name string
		opts Options
		cfg  config.Shard
		want tuning
	}{
		{name: "defaults", want: tuning{DefaultHealthMisses, DefaultStartupGrace, DefaultSurge}},
		{name: "config", cfg: config.Shard{HealthMisses: 5, AgentStartupGrace: config.Duration(time.Minute), RotationSurge: 2},
			want: tuning{5, time.Minute, 2}},
		{name: "options win", opts: Options{HealthMisses: 7, StartupGrace: time.Second, Surge: 3},
			cfg:  config.Shard{HealthMisses: 5, AgentStartupGrace: config.Duration(time.Minute), RotationSurge: 2},
			want: tuning{7, time.Second, 3}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &config.Config{Shard: tc.cfg}
			r := &Reconciler{o: tc.opts}
			r.o.Config = func() *config.Config { return cfg }
			require.Equal(t, tc.want, tuning{r.healthMisses(), r.startupGrace(), r.surge()})
		})
	}
}
