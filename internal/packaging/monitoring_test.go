package packaging_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	opmetrics "github.com/nstance-dev/nstance/internal/operator/metrics"
	srvmetrics "github.com/nstance-dev/nstance/internal/server/metrics"
)

const monitoringRel = "deploy/monitoring"

// describer is a Registerer that records the name of every series the
// collectors registered on it describe.
type describer struct{ names map[string]bool }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (d *describer) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for desc := range ch {
		if m := fqName.FindStringSubmatch(desc.String()); m != nil {
			d.names[m[1]] = true
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

// exportedNames is every series name the server's and the operator's
// metric packages register, read from their collectors' descriptions.
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	d := &describer{names: map[string]bool{}}
	srvmetrics.New(d, srvmetrics.Process{})
	m, err := opmetrics.New(d)
	require.NoError(t, err)
	require.NoError(t, m.WatchDrains(func() int { return 0 }))
	for _, must := range []string{"grpc_server_handled_total", "grpc_server_handling_seconds", "nstance_server_instances",
		"nstance_server_reconcile_queue_depth", "nstance_operator_drain_duration_seconds", "process_resident_memory_bytes"} {
		require.True(t, d.names[must], "the describer sees %s", must)
	}
	return d.names
}

// scrapeSeries are the series Prometheus itself writes for every target.
var scrapeSeries = map[string]bool{"up": true}

// known reports whether a selector's metric name is exported (or written by
// the scrape), histogram and summary suffixes included.
func known(exported map[string]bool, name string) bool {
	if exported[name] || scrapeSeries[name] {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && exported[base] {
			return true
		}
	}
	return false
}

// metricNames returns the metric names an expression selects; every
// selector must name its metric.
func metricNames(t *testing.T, where, expr string) []string {
	t.Helper()
	e, err := parser.ParseExpr(expr)
	require.NoError(t, err, "%s: %s", where, expr)
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			require.NotEmpty(t, vs.Name, "%s: every selector names its metric: %s", where, expr)
			names = append(names, vs.Name)
		}
		return nil
	})
	require.NotEmpty(t, names, "%s selects no series: %s", where, expr)
	return names
}

// dashboardVars stands in for the Grafana variables the queries use.
var dashboardVars = strings.NewReplacer("$__rate_interval", "5m", "$tenant", ".*", "$group", ".*")

func TestMonitoringRules(t *testing.T) {
	exported := exportedNames(t)
	raw, err := os.ReadFile(filepath.Join(root, monitoringRel, "prometheusrule.yaml"))
	require.NoError(t, err)
	var pr struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name   string            `json:"name"`
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
		Spec struct {
			Groups json.RawMessage `json:"groups"`
		} `json:"spec"`
	}
	require.NoError(t, yaml.UnmarshalStrict(raw, &pr, yaml.DisallowUnknownFields))
	require.Equal(t, "monitoring.coreos.com/v1", pr.APIVersion)
	require.Equal(t, "PrometheusRule", pr.Kind)
	require.NotEmpty(t, pr.Metadata.Name)
	// The spec's groups are a Prometheus rules file: Prometheus's own
	// parser checks them (names, durations, templates, PromQL).
	groupsYAML, err := yaml.JSONToYAML([]byte(`{"groups":` + string(pr.Spec.Groups) + `}`))
	require.NoError(t, err)
	rgs, errs := rulefmt.Parse(groupsYAML, false)
	require.Empty(t, errs)
	alerts := map[string]bool{}
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert, "group %s: alerting rules only", g.Name)
			alerts[r.Alert] = true
			require.NotEmpty(t, r.Labels["severity"], "%s has a severity", r.Alert)
			require.NotEmpty(t, r.Annotations["summary"], "%s has a summary", r.Alert)
			for _, name := range metricNames(t, r.Alert, r.Expr) {
				require.True(t, known(exported, name), "alert %s names %s, which no binary exports", r.Alert, name)
			}
		}
	}
	for _, want := range []string{"NstanceCertificateExpiringSoon", "NstanceLeaderFlapping", "NstanceNoShardLeader",
		"NstanceServerDown", "NstanceUnhealthyInstances", "NstanceDrainsPastDeadline", "NstanceRegistrationFailures",
		"NstanceOperatorDown", "NstanceOperatorShardDown"} {
		require.True(t, alerts[want], "alert %s exists", want)
	}
}

func TestMonitoringDashboard(t *testing.T) {
	exported := exportedNames(t)
	raw, err := os.ReadFile(filepath.Join(root, monitoringRel, "grafana-dashboard.json"))
	require.NoError(t, err)
	type target struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	}
	type panel struct {
		Title   string   `json:"title"`
		Type    string   `json:"type"`
		Targets []target `json:"targets"`
		Panels  []panel  `json:"panels"`
	}
	var dash struct {
		UID        string  `json:"uid"`
		Title      string  `json:"title"`
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	require.NoError(t, json.Unmarshal(raw, &dash))
	require.NotEmpty(t, dash.UID)
	used := map[string]bool{}
	queries := 0
	var walk func(ps []panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			require.NotEmpty(t, p.Targets, "panel %q has queries", p.Title)
			for _, tg := range p.Targets {
				queries++
				for _, name := range metricNames(t, p.Title+"/"+tg.RefID, dashboardVars.Replace(tg.Expr)) {
					require.True(t, known(exported, name), "panel %q names %s, which no binary exports", p.Title, name)
					used[name] = true
				}
			}
		}
	}
	walk(dash.Panels)
	require.Greater(t, queries, 20)
	// Variable queries: label_values(selector, label).
	lv := regexp.MustCompile(`^label_values\((.+),\s*\w+\)$`)
	for _, v := range dash.Templating.List {
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)["query"].(string)
		m := lv.FindStringSubmatch(q)
		require.NotNil(t, m, "variable %s: %q", v.Name, q)
		for _, name := range metricNames(t, "variable "+v.Name, dashboardVars.Replace(m[1])) {
			require.True(t, known(exported, name), "variable %s names %s", v.Name, name)
		}
	}
	// The figures issue 20 asks for are all on the dashboard.
	var missing []string
	for _, want := range []string{"grpc_server_handled_total", "grpc_server_handling_seconds_bucket", "nstance_server_instances",
		"nstance_server_group_desired_instances", "nstance_server_group_ready_instances", "nstance_server_reconcile_queue_depth",
		"nstance_server_reconcile_duration_seconds_bucket", "nstance_server_drains_pending", "nstance_server_drain_oldest_age_seconds",
		"nstance_server_agents_connected", "nstance_server_health_report_oldest_age_seconds", "nstance_server_registrations_total",
		"nstance_server_provider_calls_total", "nstance_server_provider_errors_total", "nstance_server_election_term",
		"nstance_server_leadership_transitions_total", "nstance_server_certificate_expiry_timestamp_seconds",
		"nstance_operator_group_sync_duration_seconds_bucket", "nstance_operator_shard_up", "nstance_operator_drain_duration_seconds_bucket",
		"nstance_operator_evictions_total"} {
		if !used[want] {
			missing = append(missing, want)
		}
	}
	sort.Strings(missing)
	require.Empty(t, missing, "series missing from the dashboard")
}
