package packaging_test

import (
	"debug/buildinfo"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

const (
	promtoolModuleRel = "scripts/tools/promtool"
	alertTestsRel     = "deploy/monitoring/tests/prometheusrule_test.yaml"
	runbooksRel       = "docs/runbooks"
	// runbookBase is where every alert's runbook_url points.
	runbookBase = "https://github.com/nstance-dev/nstance/blob/main/docs/runbooks/"
)

// ruleGroups returns the rule groups of deploy/monitoring/prometheusrule.yaml
// as a plain Prometheus rules file and parsed.
func ruleGroups(t *testing.T) ([]byte, *rulefmt.RuleGroups) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, monitoringRel, "prometheusrule.yaml"))
	require.NoError(t, err)
	var pr struct {
		Spec struct {
			Groups json.RawMessage `json:"groups"`
		} `json:"spec"`
	}
	require.NoError(t, yaml.Unmarshal(raw, &pr))
	groupsYAML, err := yaml.JSONToYAML([]byte(`{"groups":` + string(pr.Spec.Groups) + `}`))
	require.NoError(t, err)
	rgs, errs := rulefmt.Parse(groupsYAML, false)
	require.Empty(t, errs)
	return groupsYAML, rgs
}

func alertNames(rgs *rulefmt.RuleGroups) []string {
	var names []string
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			names = append(names, r.Alert)
		}
	}
	slices.Sort(names)
	return names
}

var promtoolOnce sync.Once

// promtool returns bin/promtool, built by the Makefile's tool rule when
// missing, and checks it was built from the Prometheus version that
// scripts/tools/promtool pins.
func promtool(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(root, "bin", "promtool")
	promtoolOnce.Do(func() {
		if _, err := os.Stat(bin); err == nil {
			return
		}
		cmd := exec.Command("make", "--no-print-directory", bin)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Logf("make %s: %v\n%s", bin, err, out)
		}
	})
	info, err := buildinfo.ReadFile(bin)
	require.NoError(t, err, "promtool is needed in ./bin (make bin/promtool)")
	gomod, err := os.ReadFile(filepath.Join(root, promtoolModuleRel, "go.mod"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^require github\.com/prometheus/prometheus (v\S+)$`).FindSubmatch(gomod)
	require.NotNil(t, m, "%s/go.mod pins github.com/prometheus/prometheus", promtoolModuleRel)
	pinned := string(m[1])
	// The module of the main package is recorded as the main module.
	var built string
	for _, d := range append([]*debug.Module{&info.Main}, info.Deps...) {
		if d.Path == "github.com/prometheus/prometheus" {
			built = d.Version
		}
	}
	require.Equal(t, pinned, built, "bin/promtool is not the pinned build: run make -B bin/promtool")
	return bin
}

// TestMonitoringAlertUnitTests runs deploy/monitoring/tests with promtool
// over the PrometheusRule's groups: NstanceNoShardLeader fires when every
// server of a shard disappears, NstanceOperatorDown when the operator is
// gone, and a healthy cluster fires nothing.
func TestMonitoringAlertUnitTests(t *testing.T) {
	groupsYAML, rgs := ruleGroups(t)
	tests, err := os.ReadFile(filepath.Join(root, alertTestsRel))
	require.NoError(t, err)

	// The test file covers what the acceptance asks for: the scenarios by
	// name, and in the healthy one every alert, expecting none to fire.
	var tf struct {
		RuleFiles []string `json:"rule_files"`
		Tests     []struct {
			Name  string `json:"name"`
			Tests []struct {
				Alertname string `json:"alertname"`
				ExpAlerts []any  `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	require.NoError(t, yaml.Unmarshal(tests, &tf))
	require.Equal(t, []string{"rules.yaml"}, tf.RuleFiles)
	firing := map[string][]string{}
	var healthy []string
	for _, tg := range tf.Tests {
		for _, at := range tg.Tests {
			if len(at.ExpAlerts) > 0 {
				firing[tg.Name] = append(firing[tg.Name], at.Alertname)
			} else if tg.Name == "healthy" {
				require.NotContains(t, healthy, at.Alertname)
				healthy = append(healthy, at.Alertname)
			}
		}
	}
	require.Contains(t, firing["all servers of a shard disappear"], "NstanceNoShardLeader")
	require.Contains(t, firing["operator gone"], "NstanceOperatorDown")
	require.Empty(t, firing["healthy"], "the healthy case expects no alert")
	slices.Sort(healthy)
	require.Equal(t, alertNames(rgs), healthy, "the healthy case checks every alert")

	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "rules.yaml"), groupsYAML, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "prometheusrule_test.yaml"), tests, 0o600))
	bin := promtool(t)
	out, err := execOut(dir, bin, "check", "rules", "rules.yaml")
	require.NoError(t, err, "promtool check rules:\n%s", out)
	t.Log(strings.TrimSpace(out))
	out, err = execOut(dir, bin, "test", "rules", "prometheusrule_test.yaml")
	require.NoError(t, err, "promtool test rules:\n%s", out)
	require.Contains(t, out, "SUCCESS")
	t.Log(strings.TrimSpace(out))
}

// runbookSections are the headings every runbook has, in this order.
var runbookSections = []string{"## Meaning", "## Impact", "## Diagnosis", "## Mitigation"}

// TestMonitoringRunbooks: every alert links docs/runbooks/<alert>.md, which
// exists with its sections; every runbook belongs to an alert and the index
// lists it; commands in annotations are code (backticks), so
// TestDocumentedCommands finds and checks them.
func TestMonitoringRunbooks(t *testing.T) {
	_, rgs := ruleGroups(t)
	index, err := os.ReadFile(filepath.Join(root, runbooksRel, "README.md"))
	require.NoError(t, err)
	// nstance-admin is only ever a command; the other names are programs
	// prose may name, but not with arguments.
	bare := regexp.MustCompile(`(?:^|[^/\w-])(?:nstance-admin\b|nstance-(?:server|operator|agent) +-)`)
	alerts := map[string]bool{}
	for _, g := range rgs.Groups {
		for _, r := range g.Rules {
			alerts[r.Alert] = true
			require.Equal(t, runbookBase+r.Alert+".md", r.Annotations["runbook_url"], "%s links its runbook", r.Alert)
			page, err := os.ReadFile(filepath.Join(root, runbooksRel, r.Alert+".md"))
			require.NoError(t, err, "runbook of %s", r.Alert)
			text := string(page)
			require.True(t, strings.HasPrefix(text, "# "+r.Alert+"\n"), "%s.md starts with its title", r.Alert)
			last := -1
			for _, s := range runbookSections {
				i := strings.Index(text, "\n"+s+"\n")
				require.Greater(t, i, last, "%s.md has %q after the previous section", r.Alert, s)
				last = i
			}
			require.Contains(t, string(index), "("+r.Alert+".md)", "the runbook index lists %s", r.Alert)
			for key, a := range r.Annotations {
				outside := regexp.MustCompile("`[^`]*`").ReplaceAllString(a, "")
				require.False(t, bare.MatchString(outside), "%s %s names a command outside backticks: %s", r.Alert, key, a)
			}
		}
	}
	pages, err := filepath.Glob(filepath.Join(root, runbooksRel, "*.md"))
	require.NoError(t, err)
	for _, p := range pages {
		name := strings.TrimSuffix(filepath.Base(p), ".md")
		require.True(t, name == "README" || alerts[name], "%s is the runbook of no alert", p)
	}
}
