package fleetapp

import (
	"github.com/nstance-dev/nstance/internal/server/fleet"
	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/metrics"
)

// FleetMetrics is how the server metrics read a fleet's stores at scrape
// time.
func FleetMetrics(f *fleet.Fleet) metrics.Fleet {
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
