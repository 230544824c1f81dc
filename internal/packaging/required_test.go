package packaging_test

import (
	"encoding/base64"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
)

// chartCase is one chart, the file with the least values it installs with,
// and the values its schema names when the defaults are used.
type chartCase struct {
	name, chart, minimal string
	missing              []string
}

func requiredCharts() []chartCase {
	return []chartCase{
		{"operator", chartRel, minimalRel, []string{"at '/config/clusterID': minLength", "at '/config/shards': minProperties"}},
		{"server", serverChartRel, serverMinimalRel, []string{"at '/shards': minProperties", "at '/storage/bucket': minLength", "at '/encryptionKey/value': minLength"}},
	}
}

// TestChartsRequireValues: helm lint --strict, helm template and helm
// install --dry-run=server against the envtest kube-apiserver fail with the
// charts' defaults, naming each missing value, and pass with the chart's
// ci/minimal-values.yaml.
func TestChartsRequireValues(t *testing.T) {
	e := apiServer(t)
	for _, tc := range requiredCharts() {
		t.Run(tc.name, func(t *testing.T) {
			ns := "required-" + tc.name
			ensureNamespaces(t, e, ns)
			commands := map[string][]string{
				"lint":     {"lint", "--strict", tc.chart},
				"template": {"template", tc.name, tc.chart, "--namespace", ns},
				// CRDs are envtest's already (the chart would take them over).
				"server dry run": {"install", tc.name, tc.chart, "--namespace", ns, "--dry-run=server",
					"--kubeconfig", e.Kubeconfig, "--set", "crds.install=false"},
			}
			if tc.name == "server" {
				commands["server dry run"] = commands["server dry run"][:len(commands["server dry run"])-2]
			}
			for what, args := range commands {
				t.Run(what+" with defaults fails", func(t *testing.T) {
					out, err := execOut(root, helm(t), args...)
					require.Error(t, err, "%s", out)
					for _, m := range tc.missing {
						require.Contains(t, out, m)
					}
				})
				t.Run(what+" with minimal values passes", func(t *testing.T) {
					out := run(t, root, helm(t), append(args, "-f", tc.minimal)...)
					switch what {
					case "lint":
						require.Contains(t, out, "0 chart(s) failed")
						require.NotContains(t, out, "[WARNING]")
					case "template":
						require.NotEmpty(t, ofKind(decode(t, out), "Deployment"))
					default: // the API server accepted every object, nothing stored
						require.Contains(t, out, "STATUS: pending-install")
						require.Contains(t, out, "kind: Deployment")
					}
				})
			}
		})
	}
}

// webhookSecret returns the chart-generated webhook Secret's data from a
// rendering.
func webhookSecret(t *testing.T, manifest, name string) map[string][]byte {
	t.Helper()
	o, ok := find(decode(t, manifest), "Secret", name)
	require.True(t, ok, "no generated webhook Secret")
	var s corev1.Secret
	into(t, o, &s)
	require.NotEmpty(t, s.Data["tls.crt"])
	return s.Data
}

// TestWebhookCertificateStable: without cert-manager the chart generates the
// webhook certificate once. Installed for real into the envtest
// kube-apiserver, every later render against that cluster (helm template
// --dry-run=server, helm upgrade) reuses the Secret through lookup, so two
// renders give identical certificates. Plain `helm template` cannot see the
// cluster and generates a new one each time (GitOps: use cert-manager).
func TestWebhookCertificateStable(t *testing.T) {
	e := apiServer(t)
	// A release of its own: its cluster-scoped objects collide with no
	// other test's.
	const ns, rel = "webhook-stable", "stable"
	secret := rel + "-nstance-operator-webhook-tls"
	ensureNamespaces(t, e, ns)
	// No pods run in envtest: the webhook must not block other tests.
	values := []string{"--namespace", ns, "-f", minimalRel, "--set", "crds.install=false",
		"--set", "webhook.failurePolicy=Ignore", "--kubeconfig", e.Kubeconfig}
	t.Cleanup(func() {
		if out, err := execOut(root, helm(t), "uninstall", rel, "--namespace", ns, "--kubeconfig", e.Kubeconfig); err != nil {
			t.Logf("helm uninstall: %v\n%s", err, out)
		}
	})
	run(t, root, helm(t), append([]string{"install", rel, chartRel}, values...)...)
	out := kubectl(t, e, "", "get", "secret", "-n", ns, secret, "-o", "jsonpath={.data.tls\\.crt}")
	require.NotEmpty(t, out)

	render := func() map[string][]byte {
		return webhookSecret(t, run(t, root, helm(t), append([]string{"template", rel, chartRel, "--dry-run=server"}, values...)...), secret)
	}
	first, second := render(), render()
	require.Equal(t, first, second, "two renders against the cluster differ")
	require.Equal(t, out, base64.StdEncoding.EncodeToString(first["tls.crt"]), "the renders reuse the installed certificate")

	run(t, root, helm(t), append([]string{"upgrade", rel, chartRel}, values...)...)
	after := kubectl(t, e, "", "get", "secret", "-n", ns, secret, "-o", "jsonpath={.data.tls\\.crt}")
	require.Equal(t, out, after, "helm upgrade replaced the webhook certificate")
	caBundle := kubectl(t, e, "", "get", "validatingwebhookconfiguration", rel+"-nstance-operator-validating",
		"-o", "jsonpath={.webhooks[0].clientConfig.caBundle}")
	ca := kubectl(t, e, "", "get", "secret", "-n", ns, secret, "-o", "jsonpath={.data.ca\\.crt}")
	require.Equal(t, ca, caBundle, "the webhook trusts the Secret's CA")

	// Without a cluster, each render generates its own.
	plain := func() map[string][]byte {
		return webhookSecret(t, run(t, root, helm(t), "template", rel, chartRel, "--namespace", ns, "-f", minimalRel), secret)
	}
	require.NotEqual(t, plain()["tls.crt"], plain()["tls.crt"])
}
