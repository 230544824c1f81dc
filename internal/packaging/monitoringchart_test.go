package packaging_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// TestChartMonitoringCopies fails when a chart's copy of deploy/monitoring
// drifts: run `make helm-sync`.
func TestChartMonitoringCopies(t *testing.T) {
	for _, chart := range []string{chartRel, serverChartRel} {
		for _, f := range []string{"prometheusrule.yaml", "grafana-dashboard.json"} {
			want, err := os.ReadFile(filepath.Join(root, monitoringRel, f))
			require.NoError(t, err)
			got, err := os.ReadFile(filepath.Join(root, chart, "files", "monitoring", f))
			require.NoError(t, err, "run `make helm-sync`")
			require.Equal(t, string(want), string(got), "%s/files/monitoring/%s differs from deploy/monitoring: run `make helm-sync`", chart, f)
		}
	}
}

// monitored is one chart rendered with every monitoring toggle on.
type monitored struct {
	name, chart, values, release, scrapeKind string
}

var monitoredCharts = []monitored{
	{"operator", chartRel, minimalRel, release, "ServiceMonitor"},
	{"server", serverChartRel, serverMinimalRel, serverRelease, "PodMonitor"},
}

func (m monitored) render(t *testing.T, set ...string) []object {
	t.Helper()
	args := []string{"template", m.release, m.chart, "--namespace", "nstance-mon", "-f", m.values}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return decode(t, run(t, root, helm(t), args...))
}

// TestChartMonitoring: off by default; switched on, the operator chart
// renders a ServiceMonitor on its metrics Service and the server chart a
// PodMonitor on every server's health port, each a PrometheusRule holding
// its share of deploy/monitoring's groups (every group in exactly one chart,
// unchanged, loadable by Prometheus' rule parser) and a ConfigMap holding
// the dashboard for Grafana's sidecar.
func TestChartMonitoring(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(root, monitoringRel, "prometheusrule.yaml"))
	require.NoError(t, err)
	var source struct {
		Spec struct {
			Groups []map[string]any `json:"groups"`
		} `json:"spec"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &source))
	require.NotEmpty(t, source.Spec.Groups)
	dashboard, err := os.ReadFile(filepath.Join(root, monitoringRel, "grafana-dashboard.json"))
	require.NoError(t, err)

	placed := map[string]string{} // group -> chart
	for _, m := range monitoredCharts {
		t.Run(m.name, func(t *testing.T) {
			for _, kind := range []string{m.scrapeKind, "PrometheusRule"} {
				_, ok := find(m.render(t), kind, "")
				require.False(t, ok, "%s rendered by default", kind)
			}
			objs := m.render(t, "monitoring."+lowerFirst(m.scrapeKind)+".enabled=true", "monitoring."+lowerFirst(m.scrapeKind)+".interval=30s",
				"monitoring.prometheusRule.enabled=true", "monitoring.prometheusRule.labels.release=kube-prometheus",
				"monitoring.dashboard.enabled=true")

			ruleObj, ok := find(objs, "PrometheusRule", "")
			require.True(t, ok)
			require.Equal(t, "kube-prometheus", ruleObj.Metadata.Labels["release"])
			var rule struct {
				Spec struct {
					Groups []map[string]any `json:"groups"`
				} `json:"spec"`
			}
			require.NoError(t, json.Unmarshal(ruleObj.raw, &rule))
			require.NotEmpty(t, rule.Spec.Groups)
			spec, err := yaml.Marshal(rule.Spec)
			require.NoError(t, err)
			_, errs := rulefmt.Parse(spec, false)
			require.Empty(t, errs, "Prometheus rejects the rendered rules")
			for _, g := range rule.Spec.Groups {
				name, _ := g["name"].(string)
				require.NotContains(t, placed, name, "group %s in two charts", name)
				placed[name] = m.name
				for _, sg := range source.Spec.Groups {
					if sg["name"] == name {
						require.Equal(t, sg, g, "group %s differs from deploy/monitoring", name)
					}
				}
			}

			cmObj, ok := find(objs, "ConfigMap", m.release+"-dashboard")
			require.True(t, ok)
			require.Equal(t, "1", cmObj.Metadata.Labels["grafana_dashboard"])
			var cm corev1.ConfigMap
			into(t, cmObj, &cm)
			require.JSONEq(t, string(dashboard), cm.Data["nstance.json"])

			scrapeObj, ok := find(objs, m.scrapeKind, "")
			require.True(t, ok)
			var scrape struct {
				Spec struct {
					Selector struct {
						MatchLabels map[string]string `json:"matchLabels"`
					} `json:"selector"`
					NamespaceSelector struct {
						MatchNames []string `json:"matchNames"`
					} `json:"namespaceSelector"`
					Endpoints    []map[string]any `json:"endpoints"`
					PodEndpoints []map[string]any `json:"podMetricsEndpoints"`
				} `json:"spec"`
			}
			require.NoError(t, json.Unmarshal(scrapeObj.raw, &scrape))
			require.Equal(t, []string{"nstance-mon"}, scrape.Spec.NamespaceSelector.MatchNames)
			sel := scrape.Spec.Selector.MatchLabels
			require.NotEmpty(t, sel)
			matches := func(labels map[string]string) bool {
				for k, v := range sel {
					if labels[k] != v {
						return false
					}
				}
				return true
			}
			switch m.scrapeKind {
			case "ServiceMonitor":
				// Exactly the metrics Service, on its metrics port.
				require.Len(t, scrape.Spec.Endpoints, 1)
				require.Equal(t, "metrics", scrape.Spec.Endpoints[0]["port"])
				require.Equal(t, "30s", scrape.Spec.Endpoints[0]["interval"])
				// The operator's secure diagnostics endpoint: HTTPS with
				// Prometheus' ServiceAccount token.
				require.Equal(t, "https", scrape.Spec.Endpoints[0]["scheme"])
				require.Equal(t, "/var/run/secrets/kubernetes.io/serviceaccount/token", scrape.Spec.Endpoints[0]["bearerTokenFile"])
				_, ok := find(objs, "ClusterRole", release+"-metrics-reader")
				require.True(t, ok, "a role scrapers can be bound to")
				var selected []string
				for _, o := range ofKind(objs, "Service") {
					var svc corev1.Service
					into(t, o, &svc)
					if matches(svc.Labels) {
						selected = append(selected, svc.Name)
						require.Equal(t, "metrics", svc.Spec.Ports[0].Name)
					}
				}
				require.Equal(t, []string{release + "-metrics"}, selected)
			case "PodMonitor":
				// Every server of every shard, on the health port.
				require.Len(t, scrape.Spec.PodEndpoints, 1)
				require.Equal(t, "health", scrape.Spec.PodEndpoints[0]["port"])
				require.Equal(t, "/metrics", scrape.Spec.PodEndpoints[0]["path"])
				deps := ofKind(objs, "Deployment")
				require.NotEmpty(t, deps)
				for _, o := range deps {
					var d appsv1.Deployment
					into(t, o, &d)
					require.True(t, matches(d.Spec.Template.Labels), "%s's pods are not scraped", d.Name)
				}
			}
		})
	}
	for _, g := range source.Spec.Groups {
		require.Contains(t, placed, g["name"], "group %v of deploy/monitoring is in neither chart (charts take groups by name prefix)", g["name"])
	}
}

func lowerFirst(s string) string { return strings.ToLower(s[:1]) + s[1:] }
