package metrics

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nstance-dev/nstance/internal/server/groups"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
)

func TestFleetCollectorReadsStoresAtScrapeTime(t *testing.T) {
	reg := prometheus.NewRegistry()
	leading := true
	s := New(reg, Process{ShardElection: func() (bool, int64) { return leading, 7 }})
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	ptr := func(t time.Time) *time.Time { return &t }
	recs := []*instances.Record{
		{ID: "a", Tenant: "t", GroupID: "web", State: instances.StateRunning},
		{ID: "b", Tenant: "t", GroupID: "web", State: instances.StateUnhealthy, LastHealthAt: ptr(now.Add(-90 * time.Second))},
		{ID: "c", Tenant: "t", GroupID: "web", State: instances.StatePendingDeletion, DrainTimeout: time.Minute,
			DrainDeadline: ptr(now.Add(-10 * time.Second))}, // announced 70s ago, 10s late
		{ID: "d", Tenant: "t", GroupID: "web", State: instances.StatePendingDeletion, DrainTimeout: time.Minute,
			DrainDeadline: ptr(now.Add(30 * time.Second)), DrainAcked: true},
		{ID: "e", Tenant: "t", State: instances.StateRunning, OnDemand: true},
	}
	s.SetFleet(Fleet{
		Groups: func() []*groups.Group {
			return []*groups.Group{{Tenant: "t", ID: "web", Spec: groups.Spec{Size: 3}}, {Tenant: "t", ID: "empty", Spec: groups.Spec{Size: 0}}}
		},
		Instances:       func() []*instances.Record { return recs },
		AgentsConnected: func() int { return 2 },
		LastReport: func(id string) (time.Time, bool) {
			if id == "a" {
				return now.Add(-2 * time.Second), true
			}
			return time.Time{}, false
		},
		Now: func() time.Time { return now },
	})
	g := func(name string, labels ...string) float64 {
		t.Helper()
		fams, err := reg.Gather()
		require.NoError(t, err)
		for _, f := range fams {
			if f.GetName() != name {
				continue
			}
		metric:
			for _, m := range f.GetMetric() {
				for i, l := range m.GetLabel() {
					if i*2+1 >= len(labels) || l.GetName() != labels[i*2] || l.GetValue() != labels[i*2+1] {
						continue metric
					}
				}
				if len(m.GetLabel())*2 != len(labels) {
					continue
				}
				return m.GetGauge().GetValue()
			}
		}
		t.Fatalf("no %s%v", name, labels)
		return 0
	}
	require.Equal(t, 1.0, g("nstance_server_instances", "group", "web", "state", "running", "tenant", "t"))
	require.Equal(t, 1.0, g("nstance_server_instances", "group", "web", "state", "unhealthy", "tenant", "t"))
	require.Equal(t, 2.0, g("nstance_server_instances", "group", "web", "state", "pending_deletion", "tenant", "t"))
	require.Equal(t, 0.0, g("nstance_server_instances", "group", "web", "state", "creating", "tenant", "t"))
	require.Equal(t, 1.0, g("nstance_server_instances", "group", "", "state", "running", "tenant", "t"))
	require.Equal(t, 3.0, g("nstance_server_group_desired_instances", "group", "web", "tenant", "t"))
	require.Equal(t, 0.0, g("nstance_server_group_desired_instances", "group", "empty", "tenant", "t"))
	require.Equal(t, 2.0, g("nstance_server_group_actual_instances", "group", "web", "tenant", "t"), "members pending deletion do not count")
	require.Equal(t, 1.0, g("nstance_server_group_ready_instances", "group", "web", "tenant", "t"), "running members without GroupReady")
	require.Equal(t, 1.0, g("nstance_server_drains_pending", "group", "web", "tenant", "t"), "an acknowledged drain is not pending")
	require.Equal(t, 1.0, g("nstance_server_drains_past_deadline", "group", "web", "tenant", "t"))
	require.Equal(t, 70.0, g("nstance_server_drain_oldest_age_seconds", "group", "web", "tenant", "t"))
	require.Equal(t, 90.0, g("nstance_server_health_report_oldest_age_seconds", "group", "web", "tenant", "t"),
		"the record's last health time when the tracker has none")
	require.Equal(t, 2.0, g("nstance_server_agents_connected"))
	require.Equal(t, 7.0, g("nstance_server_election_term", "election", "shard"))

	// A standby exports no fleet figures (its stores are not loaded).
	leading = false
	require.Equal(t, 0, testutil.CollectAndCount(s.fleet))
}

func TestProviderObserverAndInstrumented(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := New(reg, Process{})
	p := provider.Instrumented(mock.New(), s.Provider())
	ctx := context.Background()
	inst, err := p.Create(ctx, provider.CreateRequest{InstanceID: "i-1"})
	require.NoError(t, err)
	_, err = p.Status(ctx, inst.InstanceID)
	require.NoError(t, err)
	_, err = p.Status(ctx, "missing")
	require.ErrorIs(t, err, provider.ErrNotFound)
	_, err = p.List(ctx)
	require.NoError(t, err)
	require.NoError(t, p.Delete(ctx, inst.InstanceID))
	s.Provider().ObserveCall("delete", time.Millisecond, errors.New("quota"))
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP nstance_server_provider_calls_total Calls to the infrastructure provider, by operation.
# TYPE nstance_server_provider_calls_total counter
nstance_server_provider_calls_total{operation="create"} 1
nstance_server_provider_calls_total{operation="delete"} 2
nstance_server_provider_calls_total{operation="list"} 1
nstance_server_provider_calls_total{operation="status"} 2
# HELP nstance_server_provider_errors_total Provider calls that failed, by operation (status of a missing instance is no failure).
# TYPE nstance_server_provider_errors_total counter
nstance_server_provider_errors_total{operation="create"} 0
nstance_server_provider_errors_total{operation="delete"} 1
nstance_server_provider_errors_total{operation="list"} 0
nstance_server_provider_errors_total{operation="status"} 0
`), "nstance_server_provider_calls_total", "nstance_server_provider_errors_total"))
	require.Equal(t, 4, testutil.CollectAndCount(s.provTime), "one duration series per operation")
}

func TestOutcomeLeadingAndAgentCerts(t *testing.T) {
	require.Equal(t, "ok", outcome(nil))
	require.Equal(t, "permission_denied", outcome(status.Error(codes.PermissionDenied, "no")))
	require.Equal(t, "invalid_argument", outcome(status.Error(codes.InvalidArgument, "no")))
	require.Equal(t, "unknown", outcome(fmt.Errorf("plain")))

	reg := prometheus.NewRegistry()
	s := New(reg, Process{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Leading(ElectionCluster, nil)(ctx, 3); close(done) }()
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(s.transitions.WithLabelValues(ElectionCluster, "acquired")) == 1
	}, 5*time.Second, time.Millisecond)
	require.Equal(t, 0.0, testutil.ToFloat64(s.transitions.WithLabelValues(ElectionCluster, "lost")))
	cancel()
	<-done
	require.Equal(t, 1.0, testutil.ToFloat64(s.transitions.WithLabelValues(ElectionCluster, "lost")))

	t0 := time.Unix(1_000_000, 0)
	s.agentCerts.see("a", t0.Add(time.Hour))
	s.agentCerts.see("a", t0.Add(time.Minute)) // an older certificate does not win
	s.agentCerts.see("b", t0.Add(2*time.Hour))
	require.Equal(t, t0.Add(time.Hour), s.agentCerts.soonest(nil))
	require.Equal(t, t0.Add(2*time.Hour), s.agentCerts.soonest(map[string]bool{"b": true}), "gone agents are dropped")
	require.Equal(t, t0.Add(2*time.Hour), s.agentCerts.soonest(nil))
}

// describer records the names the registered collectors describe.
type describer struct{ names []string }

func (d *describer) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		if m := regexp.MustCompile(`fqName: "([^"]+)"`).FindStringSubmatch(desc.String()); m != nil {
			d.names = append(d.names, m[1])
		}
	}
	return nil
}
func (d *describer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = d.Register(c)
	}
}
func (d *describer) Unregister(prometheus.Collector) bool { return false }

// doc.go lists every series this package defines.
func TestDocListsEverySeries(t *testing.T) {
	doc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	d := &describer{}
	New(d, Process{})
	n := 0
	for _, name := range d.names {
		if strings.HasPrefix(name, "nstance_") || strings.HasPrefix(name, "grpc_") {
			n++
			require.Contains(t, string(doc), "//\t"+name, "doc.go lists %s", name)
		}
	}
	require.Greater(t, n, 30)
}
