package metrics_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nstance-dev/nstance/internal/devs3/devs3test"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/server/app"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/process"
	"github.com/nstance-dev/nstance/internal/storage"
	"github.com/nstance-dev/nstance/internal/testing/portpick"
	"github.com/nstance-dev/nstance/pkg/objstore"
	"github.com/nstance-dev/nstance/pkg/objstore/s3store"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

const testKey = "thisisatest32bytekey123456789012"

// agentBinary builds cmd/nstance-agent once per test binary run.
var agentBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "nstance-agent-bin-")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "nstance-agent")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/nstance-dev/nstance/cmd/nstance-agent").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("building nstance-agent: %v\n%s", err, out)
	}
	return bin, nil
})

func TestMain(m *testing.M) {
	code := m.Run()
	if bin, err := agentBinary(); err == nil {
		os.RemoveAll(filepath.Dir(bin))
	}
	os.Exit(code)
}

func shardConfig(reg, agent string) string {
	return fmt.Sprintf(`{
  "cluster": {"id": "c1", "leader_election": {"lease_duration": "3s", "renew_interval": "500ms", "retry_interval": "200ms"}},
  "shard": {
    "id": "s1",
    "infra": {"provider": "process", "region": "dev", "zone": "deva"},
    "bind": {"health_addr": "127.0.0.1:0", "election_addr": "127.0.0.1:0", "registration_addr": %q, "operator_addr": "127.0.0.1:0", "agent_addr": %q},
    "advertise": {"hosts": ["127.0.0.1"]},
    "health_check_interval": "200ms",
    "agent_startup_grace": "1m",
    "health_misses": 25,
    "default_drain_timeout": "5m",
    "subnet_pools": {"default": {"subnets": ["dev-subnet-a"]}},
  },
  "templates": {"worker": {"kind": "worker", "arch": "amd64", "instance_type": "dev.small", "subnet_pool": "default"}},
}`, reg, agent)
}

// scrape reads /metrics and returns every sample as "name{labels}" -> value
// (histograms as name_count and name_sum).
type samples map[string]float64

func scrape(t *testing.T, addr string) samples {
	t.Helper()
	return scrapeAs(t, addr, scrapeToken)
}

// scrapeToken is the bearer token of the test server's full /metrics view.
const scrapeToken = "scrape-token"

// scrapeAs scrapes with the bearer token ("": anonymously).
func scrapeAs(t *testing.T, addr, token string) samples {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/metrics", nil)
	require.NoError(t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	out := samples{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			key := name + labelString(m)
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				out[key] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[key] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[name+"_count"+labelString(m)] = float64(m.GetHistogram().GetSampleCount())
				out[name+"_sum"+labelString(m)] = m.GetHistogram().GetSampleSum()
			case dto.MetricType_UNTYPED:
				out[key] = m.GetUntyped().GetValue()
			}
		}
	}
	return out
}

func labelString(m *dto.Metric) string {
	if len(m.GetLabel()) == 0 {
		return ""
	}
	var parts []string
	for _, l := range m.GetLabel() {
		parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	sort.Strings(parts)
	return "{" + strings.Join(parts, ",") + "}"
}

// The real server (app + fleet assembly, process provider running real
// agents, dev-s3 storage) is scraped while a group scales up from 0 to 3
// and while one member drains: every fleet series moves with it.
func TestScrapeDuringScaleUpAndDrain(t *testing.T) {
	bin, err := agentBinary()
	require.NoError(t, err)
	s3 := devs3test.Start(t, "")
	store, err := s3store.NewWithClient(devs3test.Client(s3.URL), devs3test.Bucket, "")
	require.NoError(t, err)
	keys := layout.New("")
	// Agents must know these before the server binds them.
	regAddr, agentAddr := portpick.Addr(t), portpick.Addr(t)
	_, err = store.Put(context.Background(), keys.Config("s1"), []byte(shardConfig(regAddr, agentAddr)), objstore.PutOptions{})
	require.NoError(t, err)

	stateDir := t.TempDir()
	t.Cleanup(func() {
		// Stop the agent processes the server started, found through
		// the provider's state directory.
		p, err := process.New(process.Config{Command: []string{bin}, StateDir: stateDir, StopTimeout: time.Second})
		if err != nil {
			return
		}
		list, _ := p.List(context.Background())
		for _, inst := range list {
			_ = p.Delete(context.Background(), inst.InstanceID)
		}
	})
	tokenFile := filepath.Join(t.TempDir(), "metrics-token")
	require.NoError(t, os.WriteFile(tokenFile, []byte(scrapeToken), 0o600))
	a, err := app.New(app.Options{
		ServerID: "srv-a", Shard: "s1", Store: store, Keys: keys, CacheDir: t.TempDir(), MetricsTokenFile: tokenFile,
		Bind:           app.BindOverrides{Health: "127.0.0.1:0"},
		Getenv:         func(k string) string { return map[string]string{"NSTANCE_ENCRYPTION_KEY": testKey}[k] },
		Log:            testr.NewWithOptions(t, testr.Options{Verbosity: 0}),
		StorageBackoff: storage.Backoff{Initial: 50 * time.Millisecond, Max: 200 * time.Millisecond},
		Local: provider.Local{Command: bin, StateDir: stateDir, NodeDir: "-", WorkDir: stateDir,
			Env: []string{"NSTANCE_RECONNECT_MIN=100ms", "NSTANCE_RECONNECT_MAX=1s"}},
		Tuning: app.Tuning{ResyncInterval: time.Second},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, a.ServingGRPC, 30*time.Second, 20*time.Millisecond)
	f := a.Assembly()
	require.Eventually(t, f.Reconciler.Running, 10*time.Second, 10*time.Millisecond)
	health := a.Addrs().Health

	const tenant, group = "default", "web"
	gl := fmt.Sprintf(`{group=%q,tenant=%q}`, group, tenant)
	state := func(st instances.State) string {
		return fmt.Sprintf(`nstance_server_instances{group=%q,state=%q,tenant=%q}`, group, st, tenant)
	}
	before := scrape(t, health)
	require.Equal(t, 1.0, before["nstance_server_shard_leader"])
	require.Equal(t, 1.0, before["nstance_server_ready"])
	require.Positive(t, before[`nstance_server_election_term{election="shard"}`])
	require.Equal(t, 1.0, before[`nstance_server_leadership_transitions_total{direction="acquired",election="shard"}`])
	require.Equal(t, 0.0, before["nstance_server_agents_connected"])
	now := float64(time.Now().Unix())
	require.Greater(t, before[`nstance_server_certificate_expiry_timestamp_seconds{certificate="server"}`], now)
	require.Greater(t, before[`nstance_server_certificate_expiry_timestamp_seconds{certificate="ca"}`],
		before[`nstance_server_certificate_expiry_timestamp_seconds{certificate="server"}`]-1)
	require.NotContains(t, before, "nstance_server_group_desired_instances"+gl)
	// Every served method's gRPC series exist at zero before its first call.
	listGroups := `grpc_server_handled_total{grpc_code="OK",grpc_method="ListGroups",grpc_service="nstance.v1.OperatorService",grpc_type="unary"}`
	require.Contains(t, before, listGroups)
	require.Equal(t, 0.0, before[listGroups])

	// Scale up 0 -> 3 through the reconciler the Operator service calls.
	_, _, err = f.Ops.UpsertGroup(ctx, tenant, &nstancev1.GroupSpec{GroupId: group, Template: "worker", Size: 3,
		DrainTimeout: durationpb.New(5 * time.Minute)}, "")
	require.NoError(t, err)
	// (Whether a scrape lands while the group is still short is a race the
	// test cannot decide: the series are checked before and after.)
	var mid samples
	require.Eventually(t, func() bool {
		mid = scrape(t, health)
		// An agent whose reply was lost registers again (same key, same
		// certificate): at least one successful registration per agent.
		return mid["nstance_server_group_ready_instances"+gl] == 3 && mid["nstance_server_agents_connected"] == 3 &&
			mid[`nstance_server_registrations_total{kind="agent",outcome="ok"}`]-before[`nstance_server_registrations_total{kind="agent",outcome="ok"}`] >= 3
	}, 90*time.Second, 50*time.Millisecond, "ready, agents connected and agent registrations reach 3: %v", fleetSeries(mid))
	require.Equal(t, 3.0, mid["nstance_server_group_desired_instances"+gl])
	require.Equal(t, 3.0, mid["nstance_server_group_actual_instances"+gl])
	require.Equal(t, 3.0, mid[state(instances.StateRunning)])
	require.Equal(t, 3.0, mid[`nstance_server_provider_calls_total{operation="create"}`]-before[`nstance_server_provider_calls_total{operation="create"}`],
		"one provider create per new instance")
	require.Equal(t, 0.0, mid[`nstance_server_provider_errors_total{operation="create"}`])
	require.Greater(t, mid["nstance_server_reconcile_duration_seconds_count"], before["nstance_server_reconcile_duration_seconds_count"])
	require.Greater(t, mid["nstance_server_reconcile_enqueued_total"], before["nstance_server_reconcile_enqueued_total"])
	require.Contains(t, mid, "nstance_server_reconcile_queue_depth")
	require.Contains(t, mid, "nstance_server_health_report_oldest_age_seconds"+gl)
	require.Less(t, mid["nstance_server_health_report_oldest_age_seconds"+gl], 10.0, "agents report every 200ms")
	agentExpiry := mid[`nstance_server_certificate_expiry_timestamp_seconds{certificate="agent_soonest"}`]
	require.Greater(t, agentExpiry, now, "connected agents' certificates are seen")
	require.Equal(t, 0.0, mid["nstance_server_drains_pending"+gl])
	// The agents' streams went through the grpc-ecosystem interceptors.
	require.Positive(t, mid[`grpc_server_started_total{grpc_method="ReportHealth",grpc_service="nstance.v1.AgentService",grpc_type="bidi_stream"}`]+
		mid[`grpc_server_started_total{grpc_method="ReportHealth",grpc_service="nstance.v1.AgentService",grpc_type="client_stream"}`], "%v", grpcSeries(mid))
	registered := mid[`nstance_server_registrations_total{kind="agent",outcome="ok"}`]
	require.Equal(t, registered, mid[`grpc_server_handled_total{grpc_code="OK",grpc_method="RegisterAgent",grpc_service="nstance.v1.RegistrationService",grpc_type="unary"}`],
		"the registration counter and the gRPC middleware agree")
	require.GreaterOrEqual(t, mid[`grpc_server_handling_seconds_count{grpc_method="RegisterAgent",grpc_service="nstance.v1.RegistrationService",grpc_type="unary"}`], registered)
	// An anonymous scrape sees the same fleet without tenants or groups.
	anon := scrapeAs(t, health, "")
	require.Equal(t, 3.0, anon[`nstance_server_instances{state="running"}`])
	require.Equal(t, 3.0, anon["nstance_server_group_desired_instances"])
	for k := range anon {
		require.NotContains(t, k, "tenant=", k)
		require.NotContains(t, k, "group=", k)
	}

	// Scale down to 2: one member drains, in pending deletion until its
	// drain is acknowledged.
	_, _, err = f.Ops.UpsertGroup(ctx, tenant, &nstancev1.GroupSpec{GroupId: group, Template: "worker", Size: 2,
		DrainTimeout: durationpb.New(5 * time.Minute)}, "")
	require.NoError(t, err)
	var draining samples
	require.Eventually(t, func() bool {
		draining = scrape(t, health)
		return draining["nstance_server_drains_pending"+gl] == 1
	}, 30*time.Second, 20*time.Millisecond, "a pending drain shows: %v", fleetSeries(draining))
	require.Equal(t, 1.0, draining[state(instances.StatePendingDeletion)])
	require.Equal(t, 0.0, draining["nstance_server_drains_past_deadline"+gl])
	require.GreaterOrEqual(t, draining["nstance_server_drain_oldest_age_seconds"+gl], 0.0)
	time.Sleep(1100 * time.Millisecond)
	older := scrape(t, health)
	require.Equal(t, 1.0, older["nstance_server_drains_pending"+gl])
	require.GreaterOrEqual(t, older["nstance_server_drain_oldest_age_seconds"+gl]-draining["nstance_server_drain_oldest_age_seconds"+gl], 1.0,
		"the drain's age grows with the clock")

	victims := f.Instances.List(func(r *instances.Record) bool { return r.State == instances.StatePendingDeletion })
	require.Len(t, victims, 1)
	_, err = f.Ops.AcknowledgeDrained(ctx, tenant, victims[0].ID)
	require.NoError(t, err)
	var after samples
	require.Eventually(t, func() bool {
		after = scrape(t, health)
		return after["nstance_server_drains_pending"+gl] == 0 && after[state(instances.StatePendingDeletion)] == 0 &&
			after[state(instances.StateDeleting)] == 0 && after["nstance_server_agents_connected"] == 2 &&
			after["nstance_server_group_ready_instances"+gl] == 2
	}, 60*time.Second, 50*time.Millisecond, "the drained instance is gone: %v", fleetSeries(after))
	require.Equal(t, 0.0, after["nstance_server_drain_oldest_age_seconds"+gl])
	require.Equal(t, 1.0, after[`nstance_server_provider_calls_total{operation="delete"}`]-mid[`nstance_server_provider_calls_total{operation="delete"}`])
	require.Equal(t, 0.0, after[`nstance_server_provider_calls_total{operation="create"}`]-mid[`nstance_server_provider_calls_total{operation="create"}`])
	require.Equal(t, 2.0, after["nstance_server_group_desired_instances"+gl])
	require.Equal(t, 2.0, after["nstance_server_group_actual_instances"+gl])
	require.Equal(t, 2.0, after[state(instances.StateRunning)])
}

func fleetSeries(s samples) string { return filtered(s, "nstance_server_") }
func grpcSeries(s samples) string  { return filtered(s, "grpc_server_started") }

func filtered(s samples, prefix string) string {
	var out []string
	for k, v := range s {
		if strings.HasPrefix(k, prefix) && !strings.Contains(k, "_bucket") {
			out = append(out, fmt.Sprintf("%s=%g", k, v))
		}
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}
