package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestShardTuning: the shard config is the only source of the health and
// surge tuning; unset keys take the defaults.
func TestShardTuning(t *testing.T) {
	cases := []struct {
		name string
		s    Shard
		want Tuning
	}{
		{name: "defaults", want: Tuning{DefaultHealthCheckInterval, DefaultHealthMisses, DefaultAgentStartupGrace, DefaultAgentStartupGrace, DefaultRotationSurge, DefaultShutdownGrace}},
		{name: "config", s: Shard{HealthCheckInterval: Duration(time.Second), HealthMisses: 5, AgentStartupGrace: Duration(time.Minute),
			AgentReconnectGrace: Duration(2 * time.Minute), RotationSurge: 2, ShutdownGrace: Duration(5 * time.Second)},
			want: Tuning{time.Second, 5, time.Minute, 2 * time.Minute, 2, 5 * time.Second}},
		{name: "partly set", s: Shard{HealthMisses: 7},
			want: Tuning{DefaultHealthCheckInterval, 7, DefaultAgentStartupGrace, DefaultAgentStartupGrace, DefaultRotationSurge, DefaultShutdownGrace}},
		{name: "reconnect grace follows the startup grace", s: Shard{AgentStartupGrace: Duration(time.Minute)},
			want: Tuning{DefaultHealthCheckInterval, DefaultHealthMisses, time.Minute, time.Minute, DefaultRotationSurge, DefaultShutdownGrace}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, tc.s.Tuning())
		})
	}
}
