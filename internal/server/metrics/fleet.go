package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/internal/server/instances"
)

// Fleet is how the fleet collector reads the shard leader's state at
// scrape time. Groups and Instances are required; the rest may be nil.
type Fleet struct {
	Groups    func() []*groups.Group
	Instances func() []*instances.Record
	// GroupReady is the number of ready members of a group (the
	// reconciler's view); nil counts running members.
	GroupReady func(g *groups.Group) int
	// AgentsConnected is the number of instances with an open agent stream.
	AgentsConnected func() int
	// LastReport is when the instance's agent last reported health.
	LastReport func(id string) (time.Time, bool)
	Now        func() time.Time
}

// SetFleet makes the fleet collector read f (the shard's stores); the
// figures are exported only while shard() reports leading.
func (s *Server) SetFleet(f Fleet) {
	s.fleet.mu.Lock()
	s.fleet.f = &f
	s.fleet.mu.Unlock()
}

type fleetCollector struct {
	mu      sync.Mutex
	f       *Fleet
	leading func() bool
	certs   *agentCerts
}

var (
	groupLabels     = []string{"tenant", "group"}
	descInstances   = prometheus.NewDesc(ns+"_instances", "Instances of the shard by tenant, group (empty outside a group) and state.", []string{"tenant", "group", "state"}, nil)
	descDesired     = prometheus.NewDesc(ns+"_group_desired_instances", "Desired size of each group.", groupLabels, nil)
	descActual      = prometheus.NewDesc(ns+"_group_actual_instances", "Active members of each group (on-demand instances excluded).", groupLabels, nil)
	descReadyInst   = prometheus.NewDesc(ns+"_group_ready_instances", "Ready members of each group.", groupLabels, nil)
	descDrains      = prometheus.NewDesc(ns+"_drains_pending", "Instances pending deletion whose drain is not acknowledged yet.", groupLabels, nil)
	descDrainsLate  = prometheus.NewDesc(ns+"_drains_past_deadline", "Pending drains past their drain deadline.", groupLabels, nil)
	descDrainAge    = prometheus.NewDesc(ns+"_drain_oldest_age_seconds", "Age of the oldest pending drain (since its drain began).", groupLabels, nil)
	descAgents      = prometheus.NewDesc(ns+"_agents_connected", "Instances with an open agent stream to this server.", nil, nil)
	descHealthAge   = prometheus.NewDesc(ns+"_health_report_oldest_age_seconds", "Age of the oldest last health report among running and unhealthy members.", groupLabels, nil)
	fleetDescs      = []*prometheus.Desc{descInstances, descDesired, descActual, descReadyInst, descDrains, descDrainsLate, descDrainAge, descAgents, descHealthAge}
	reportedStates  = []instances.State{instances.StatePending, instances.StateCreating, instances.StateRunning, instances.StateUnhealthy, instances.StateStopped, instances.StatePendingDeletion, instances.StateDeleting}
	monitoredStates = map[instances.State]bool{instances.StateRunning: true, instances.StateUnhealthy: true}
)

func (c *fleetCollector) current() *Fleet {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.f == nil || (c.leading != nil && !c.leading()) {
		return nil
	}
	return c.f
}

// instanceIDs returns the set of instances the fleet knows, nil while no
// fleet is read (then nothing is dropped before the stores are loaded).
func (c *fleetCollector) instanceIDs() map[string]bool {
	f := c.current()
	if f == nil {
		return nil
	}
	ids := map[string]bool{}
	for _, r := range f.Instances() {
		ids[r.ID] = true
	}
	return ids
}

func (c *fleetCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range fleetDescs {
		ch <- d
	}
}

type groupFigures struct {
	byState                      map[instances.State]int
	actual, ready, drains, late  int
	oldestDrain, oldestReport    time.Duration
	hasDrain, hasReport, isGroup bool
	desired                      int
}

func (c *fleetCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.current()
	if f == nil {
		return
	}
	now := time.Now()
	if f.Now != nil {
		now = f.Now()
	}
	figs := map[groups.Key]*groupFigures{}
	get := func(k groups.Key) *groupFigures {
		g, ok := figs[k]
		if !ok {
			g = &groupFigures{byState: map[instances.State]int{}}
			figs[k] = g
		}
		return g
	}
	for _, g := range f.Groups() {
		fig := get(g.Key())
		fig.isGroup, fig.desired = true, g.Spec.Size
		if f.GroupReady != nil {
			fig.ready = f.GroupReady(g)
		}
	}
	for _, r := range f.Instances() {
		fig := get(groups.Key{Tenant: r.Tenant, ID: r.GroupID})
		fig.byState[r.State]++
		if r.GroupID != "" && !r.OnDemand && r.State.Active() {
			fig.actual++
			if f.GroupReady == nil && r.State == instances.StateRunning {
				fig.ready++
			}
		}
		if r.State == instances.StatePendingDeletion && !r.DrainAcked {
			fig.drains++
			if r.DrainDeadline != nil {
				if now.After(*r.DrainDeadline) {
					fig.late++
				}
				if age := now.Sub(r.DrainDeadline.Add(-r.DrainTimeout)); !fig.hasDrain || age > fig.oldestDrain {
					fig.oldestDrain, fig.hasDrain = age, true
				}
			}
		}
		if monitoredStates[r.State] {
			var last time.Time
			if f.LastReport != nil {
				last, _ = f.LastReport(r.ID)
			}
			if last.IsZero() && r.LastHealthAt != nil {
				last = *r.LastHealthAt
			}
			if !last.IsZero() {
				if age := now.Sub(last); !fig.hasReport || age > fig.oldestReport {
					fig.oldestReport, fig.hasReport = age, true
				}
			}
		}
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	for k, fig := range figs {
		for _, st := range reportedStates {
			gauge(descInstances, float64(fig.byState[st]), k.Tenant, k.ID, string(st))
		}
		if k.ID == "" && !fig.isGroup {
			// Instances outside any group: only the per-state counts.
			continue
		}
		if fig.isGroup {
			gauge(descDesired, float64(fig.desired), k.Tenant, k.ID)
		}
		gauge(descActual, float64(fig.actual), k.Tenant, k.ID)
		gauge(descReadyInst, float64(fig.ready), k.Tenant, k.ID)
		gauge(descDrains, float64(fig.drains), k.Tenant, k.ID)
		gauge(descDrainsLate, float64(fig.late), k.Tenant, k.ID)
		age := 0.0
		if fig.hasDrain {
			age = fig.oldestDrain.Seconds()
		}
		gauge(descDrainAge, age, k.Tenant, k.ID)
		if fig.hasReport {
			gauge(descHealthAge, fig.oldestReport.Seconds(), k.Tenant, k.ID)
		}
	}
	if f.AgentsConnected != nil {
		gauge(descAgents, float64(f.AgentsConnected()))
	}
}
