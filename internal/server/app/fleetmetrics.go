package app

import (
	"time"

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
	if f.agentOptions != nil {
		// The running term's agents; none between terms.
		m.AgentsConnected = func() int {
			if t := f.Term(); t != nil && t.Agents != nil {
				return t.Agents.Connected()
			}
			return 0
		}
		m.LastReport = func(id string) (time.Time, bool) {
			if t := f.Term(); t != nil && t.Agents != nil {
				return t.Agents.LastReport(id)
			}
			return time.Time{}, false
		}
	}
	return m
}
