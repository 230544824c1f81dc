package config

import "time"

// Defaults of the health and rotation tuning keys of the shard.
const (
	DefaultHealthCheckInterval = 30 * time.Second
	DefaultHealthMisses        = 3
	DefaultAgentStartupGrace   = 5 * time.Minute
	DefaultRotationSurge       = 1
	DefaultShutdownGrace       = time.Minute
)

// Tuning is the health and rotation tuning of a shard, defaults applied.
// It is read from the running config on every use, so a RefreshConfig
// applies it; nothing else (flags, options) overrides it.
type Tuning struct {
	// HealthInterval is the agents' expected report interval
	// (shard.health_check_interval).
	HealthInterval time.Duration
	// HealthMisses missed reports make an instance unhealthy (shard.health_misses).
	HealthMisses int
	// StartupGrace is how long a new instance may take to send its first
	// report (shard.agent_startup_grace).
	StartupGrace time.Duration
	// ReconnectGrace is how long after a leadership term starts the
	// instances that were already running have to reconnect to the new
	// leader and report before any health verdict on them
	// (shard.agent_reconnect_grace; default: StartupGrace).
	ReconnectGrace time.Duration
	// Surge is how many members beyond its size a group may run while
	// rotating drifted members (shard.rotation_surge).
	Surge int
	// ShutdownGrace is how long after an agent reported its host shutting
	// down the provider has to confirm (stopped, gone) before the member is
	// replaced anyway (shard.shutdown_grace).
	ShutdownGrace time.Duration
}

// Tuning returns the shard's health and rotation tuning, defaults applied.
func (s Shard) Tuning() Tuning {
	t := Tuning{HealthInterval: s.HealthCheckInterval.D(), HealthMisses: s.HealthMisses, StartupGrace: s.AgentStartupGrace.D(),
		ReconnectGrace: s.AgentReconnectGrace.D(), Surge: s.RotationSurge, ShutdownGrace: s.ShutdownGrace.D()}
	if t.HealthInterval <= 0 {
		t.HealthInterval = DefaultHealthCheckInterval
	}
	if t.HealthMisses <= 0 {
		t.HealthMisses = DefaultHealthMisses
	}
	if t.StartupGrace <= 0 {
		t.StartupGrace = DefaultAgentStartupGrace
	}
	if t.ReconnectGrace <= 0 {
		t.ReconnectGrace = t.StartupGrace
	}
	if t.Surge <= 0 {
		t.Surge = DefaultRotationSurge
	}
	if t.ShutdownGrace <= 0 {
		t.ShutdownGrace = DefaultShutdownGrace
	}
	return t
}
