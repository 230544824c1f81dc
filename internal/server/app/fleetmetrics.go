package app

import (
	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/metrics"
)

// fleetMetrics is how the server metrics read an assembly's stores at
// scrape time.
func fleetMetrics(f *Assembly) metrics.Fleet {
	m := metrics.Fleet{
		Groups:    func() []*groups.Group { return f.Groups.List("") },
		Instances: func() []*instances.Record { return f.Instances.List(nil) },
		GroupReady: func(g *groups.Group) int {
			return int(f.Reconciler.GroupStatus(g).GetReadyCount())
		},
	}
	if f.Agent != nil {
		m.AgentsConnected = f.Agent.Connected
	}
	if f.Health != nil {
		m.LastReport = f.Health.LastReport
	}
	return m
}
