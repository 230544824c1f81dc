package packaging_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	opconfig "github.com/nstance-dev/nstance/internal/operator/config"
)

var clusterctlVar = regexp.MustCompile(`\$\{([A-Z0-9_]+)(:=([^}]*))?\}`)

// substitute does what clusterctl does with ${VAR} and ${VAR:=default},
// returning the variables that had neither a value nor a default.
func substitute(text string, vars map[string]string) (string, []string) {
	var missing []string
	out := clusterctlVar.ReplaceAllStringFunc(text, func(m string) string {
		g := clusterctlVar.FindStringSubmatch(m)
		if v, ok := vars[g[1]]; ok {
			return v
		}
		if g[2] != "" {
			return g[3]
		}
		if !slices.Contains(missing, g[1]) {
			missing = append(missing, g[1])
		}
		return m
	})
	return out, missing
}

func components(t *testing.T) string {
	t.Helper()
	return run(t, root, filepath.Join(root, "deploy", "clusterctl", "components.sh"), helm(t), imageVersion)
}

func TestClusterctlComponents(t *testing.T) {
	raw := components(t)
	_, missing := substitute(raw, nil)
	slices.Sort(missing)
	require.Equal(t, []string{"NSTANCE_CLUSTER_ID", "NSTANCE_SHARD_ENDPOINTS"}, missing, "variables without defaults")
	// NSTANCE_SHARDS is the templates' comma list of shard IDs: the
	// components must not give it a second meaning.
	require.NotContains(t, raw, "${NSTANCE_SHARDS")

	for _, tc := range []struct {
		name string
		vars map[string]string
	}{
		{"required variables only", map[string]string{
			"NSTANCE_CLUSTER_ID":      "prod-1",
			"NSTANCE_SHARD_ENDPOINTS": `{"us-west-2a":{"registration_addr":"10.0.0.1:8992","operator_addr":"10.0.0.1:8993"}}`,
		}},
		{"every variable", map[string]string{
			"NSTANCE_CLUSTER_ID":      "prod-2",
			"NSTANCE_TENANT":          "team-a",
			"NSTANCE_SHARD_ENDPOINTS": `{"a":{"registration_addr":"a.internal:8992","operator_addr":"a.internal:8993"},"b":{"registration_addr":"b:1","operator_addr":"b:2"}}`,
			"NSTANCE_CA_CONFIGMAP":    "my-ca",
			"NSTANCE_NONCE_SECRET":    "my-nonce",
			"NSTANCE_CAPI_ENDPOINT":   "https://api.example:6443",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			text, missing := substitute(raw, tc.vars)
			require.Empty(t, missing)
			require.NotContains(t, text, "${")
			objs := decode(t, text)

			// clusterctl's layout: its own namespace first, cert-manager for
			// the webhook, the image of this release.
			require.Equal(t, "Namespace", objs[0].Kind)
			require.Equal(t, "nstance-system", objs[0].Metadata.Name)
			for _, o := range objs {
				if o.Kind != "Namespace" && o.Kind != "CustomResourceDefinition" && !strings.HasPrefix(o.Kind, "Cluster") && o.Kind != "ValidatingWebhookConfiguration" {
					require.NotEmpty(t, o.Metadata.Namespace, "%s has no namespace", o)
				}
			}
			// clusterctl, not Helm, manages these objects: its provider
			// label on every one, no Helm labels or resource policy.
			for _, o := range objs {
				require.Equal(t, "infrastructure-nstance", o.Metadata.Labels["cluster.x-k8s.io/provider"], "%s", o)
				for k := range o.Metadata.Labels {
					require.NotContains(t, k, "helm.sh", "%s", o)
				}
				require.NotContains(t, o.Metadata.Labels, "app.kubernetes.io/managed-by", "%s", o)
				for k := range o.Metadata.Annotations {
					require.NotContains(t, k, "helm.sh", "%s", o)
				}
			}
			require.NotContains(t, text, "helm.sh/")
			require.Len(t, ofKind(objs, "Certificate"), 1)
			crdFiles, err := filepath.Glob(filepath.Join(root, chartRel, "files", "crds", "*.yaml"))
			require.NoError(t, err)
			require.Len(t, ofKind(objs, "CustomResourceDefinition"), len(crdFiles), "every CRD, infrastructure and control plane")
			_, generated := find(objs, "Secret", release+"-webhook-tls")
			require.False(t, generated, "clusterctl components must not embed a generated key")

			cmObj, ok := find(objs, "ConfigMap", release+"-config")
			require.True(t, ok)
			var cm corev1.ConfigMap
			into(t, cmObj, &cm)
			cfg, err := opconfig.Parse([]byte(cm.Data["config.yaml"]))
			require.NoError(t, err)
			require.Equal(t, tc.vars["NSTANCE_CLUSTER_ID"], cfg.ClusterID)

			dObj, ok := find(objs, "Deployment", release)
			require.True(t, ok)
			var d appsv1.Deployment
			into(t, dObj, &d)
			c := d.Spec.Template.Spec.Containers[0]
			require.Equal(t, "ghcr.io/nstance-dev/nstance-operator:"+imageVersion, c.Image)
			env := map[string]string{}
			for _, e := range c.Env {
				env[e.Name] = e.Value
			}
			parsed, err := opconfig.ParseEnv(func(k string) string { return env[k] }, func() (string, error) { return "nstance-system", nil })
			require.NoError(t, err)
			require.Equal(t, tc.vars["NSTANCE_CAPI_ENDPOINT"], parsed.CAPIEndpoint)
			if v := tc.vars["NSTANCE_CA_CONFIGMAP"]; v != "" {
				require.Equal(t, v, parsed.CAConfigMap)
			} else {
				require.Equal(t, opconfig.DefaultCAConfigMap, parsed.CAConfigMap)
			}

			e := apiServer(t)
			ensureNamespaces(t, e, "nstance-system")
			var apply []object
			for _, o := range withoutCertManager(t, objs) {
				if o.Kind != "Namespace" { // created above; dry-run cannot create it for the rest
					apply = append(apply, o)
				}
			}
			applyDryRun(t, e, apply)
		})
	}
}

func TestClusterctlMetadata(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "metadata.yaml"))
	require.NoError(t, err)
	var md struct {
		APIVersion    string `json:"apiVersion"`
		Kind          string `json:"kind"`
		ReleaseSeries []struct {
			Major    int    `json:"major"`
			Minor    int    `json:"minor"`
			Contract string `json:"contract"`
		} `json:"releaseSeries"`
	}
	require.NoError(t, yaml.UnmarshalStrict(data, &md))
	require.Equal(t, "clusterctl.cluster.x-k8s.io/v1alpha3", md.APIVersion)
	require.Equal(t, "Metadata", md.Kind)
	require.NotEmpty(t, md.ReleaseSeries)
	for _, s := range md.ReleaseSeries {
		require.Equal(t, "v1beta2", s.Contract)
	}

	// The chart's version belongs to a declared release series.
	chart, err := os.ReadFile(filepath.Join(root, chartRel, "Chart.yaml"))
	require.NoError(t, err)
	var meta struct {
		Version string `json:"version"`
	}
	require.NoError(t, yaml.Unmarshal(chart, &meta))
	var major, minor int
	_, err = fmtSscanf(meta.Version, &major, &minor)
	require.NoError(t, err)
	require.True(t, slices.ContainsFunc(md.ReleaseSeries, func(s struct {
		Major    int    `json:"major"`
		Minor    int    `json:"minor"`
		Contract string `json:"contract"`
	}) bool {
		return s.Major == major && s.Minor == minor
	}), "chart version %s has no release series in metadata.yaml", meta.Version)
}

// TestReleasePlan checks what `make release` would run, without compiling:
// scripts/release.sh with the version, helm and the build's ldflags.
func TestReleasePlan(t *testing.T) {
	plan := run(t, root, "make", "-n", "release", "VERSION="+imageVersion, "DIST=/tmp/nstance-dist")
	require.Contains(t, plan, "scripts/release.sh")
	require.Contains(t, plan, "VERSION='"+imageVersion+"'")
	require.Contains(t, plan, "DIST='/tmp/nstance-dist'")
	require.Contains(t, plan, "internal/version.Version="+imageVersion)
	script, err := os.ReadFile(filepath.Join(root, "scripts", "release.sh"))
	require.NoError(t, err)
	// The six programs, four platforms, four images, two charts.
	require.Contains(t, string(script), "programs=(nstance-server nstance-agent nstance-operator nstance-admin dev-k8s dev-s3)")
	require.Contains(t, string(script), "platforms=(linux/amd64 linux/arm64 darwin/amd64 darwin/arm64)")
	require.Contains(t, string(script), "images=(nstance-server nstance-agent nstance-operator nstance-admin)")
	require.Contains(t, string(script), "for c in nstance-operator nstance-server; do")
}

// TestReleaseRefusesBadVersions: a version that is no semantic version tag,
// or whose minor version has no clusterctl release series, stops the release
// before anything is built, with a message saying why.
func TestReleaseRefusesBadVersions(t *testing.T) {
	for _, tc := range []struct{ version, want string }{
		{"0.3.0", "is not a semantic version tag"},
		{"v0.3", "is not a semantic version tag"},
		{"v0.3.0;rm", "is not a semantic version tag"},
		{"v7.4.0", "metadata.yaml has no release series 7.4"},
	} {
		t.Run(tc.version, func(t *testing.T) {
			dist := t.TempDir()
			cmd := exec.Command(filepath.Join(root, "scripts", "release.sh"))
			cmd.Env = append(os.Environ(), "VERSION="+tc.version, "HELM=/nonexistent/helm", "DIST="+dist, "GO=/nonexistent/go")
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "%s", out)
			require.Equal(t, 2, exit.ExitCode(), "%s", out)
			require.Contains(t, string(out), tc.want)
			entries, err := os.ReadDir(dist)
			require.NoError(t, err)
			require.Empty(t, entries, "nothing is written")
		})
	}
}

// TestReleaseProviderRepositoryOnly: release.sh --provider-repository
// writes the clusterctl provider repository of the version and nothing else
// (test/clusterctl installs it); any other argument stops it with exit 2.
func TestReleaseProviderRepositoryOnly(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "metadata.yaml"))
	require.NoError(t, err)
	var md struct {
		ReleaseSeries []struct{ Major, Minor int } `json:"releaseSeries"`
	}
	require.NoError(t, yaml.Unmarshal(data, &md))
	require.NotEmpty(t, md.ReleaseSeries)
	version := fmt.Sprintf("v%d.%d.7", md.ReleaseSeries[0].Major, md.ReleaseSeries[0].Minor)
	dist := t.TempDir()
	cmd := exec.Command(filepath.Join(root, "scripts", "release.sh"), "--provider-repository")
	cmd.Env = append(os.Environ(), "VERSION="+version, "HELM="+helm(t), "DIST="+dist, "GO=/nonexistent/go")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	var files []string
	require.NoError(t, filepath.WalkDir(dist, func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dist, path)
			files = append(files, filepath.ToSlash(rel))
		}
		return err
	}))
	repo := version + "/infrastructure-nstance/" + version + "/"
	require.ElementsMatch(t, []string{repo + "cluster-template-machinedeployment.yaml", repo + "cluster-template.yaml",
		repo + "infrastructure-components.yaml", repo + "metadata.yaml"}, files)
	components, err := os.ReadFile(filepath.Join(dist, repo, "infrastructure-components.yaml"))
	require.NoError(t, err)
	require.Contains(t, string(components), "nstance-operator:"+version)

	cmd = exec.Command(filepath.Join(root, "scripts", "release.sh"), "--charts")
	cmd.Env = append(os.Environ(), "VERSION="+version, "HELM=/nonexistent/helm", "DIST="+t.TempDir())
	out, err = cmd.CombinedOutput()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit, "%s", out)
	require.Equal(t, 2, exit.ExitCode(), "%s", out)
	require.Contains(t, string(out), "unknown argument --charts")
}

// TestClusterctlOneEnvironment runs clusterctl, built from the cluster-api
// module in go.mod, against a local provider repository laid out as a
// release (the rendered components, metadata.yaml and both templates): one
// environment renders both the components (`clusterctl generate provider`)
// and a cluster template (`clusterctl generate cluster`), each variable
// keeping its one meaning (NSTANCE_SHARD_ENDPOINTS the components' JSON
// map, NSTANCE_SHARDS the template's comma list).
func TestClusterctlOneEnvironment(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "clusterctl")
	run(t, root, "go", "build", "-o", bin, "sigs.k8s.io/cluster-api/cmd/clusterctl")

	const version = "v0.1.0"
	repo := filepath.Join(dir, "repo", "infrastructure-nstance", version)
	require.NoError(t, os.MkdirAll(repo, 0o755))
	write := func(name string, data []byte) {
		require.NoError(t, os.WriteFile(filepath.Join(repo, name), data, 0o644))
	}
	write("infrastructure-components.yaml", []byte(components(t)))
	for _, src := range []string{"metadata.yaml", "templates/cluster-template.yaml", "templates/cluster-template-machinedeployment.yaml"} {
		data, err := os.ReadFile(filepath.Join(root, src))
		require.NoError(t, err)
		write(filepath.Base(src), data)
	}
	home := filepath.Join(dir, "home")
	require.NoError(t, os.MkdirAll(filepath.Join(home, "cluster-api"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(home, "cluster-api", "clusterctl.yaml"), []byte(
		"providers:\n  - name: nstance\n    type: InfrastructureProvider\n    url: "+
			filepath.Join(repo, "infrastructure-components.yaml")+"\n"), 0o644))

	environ := []string{
		"HOME=" + home, "XDG_CONFIG_HOME=" + home, "CLUSTERCTL_DISABLE_VERSIONCHECK=true",
		"NSTANCE_CLUSTER_ID=prod",
		`NSTANCE_SHARD_ENDPOINTS={"us-east-1a":{"registration_addr":"a.internal:8992","operator_addr":"a.internal:8993"},"us-east-1b":{"registration_addr":"b.internal:8992","operator_addr":"b.internal:8993"}}`,
		"NSTANCE_SHARDS=us-east-1a,us-east-1b",
		"NSTANCE_CONTROL_PLANE_HOST=api.example.internal",
	}
	clusterctl := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = environ
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		require.NoError(t, cmd.Run(), "clusterctl %s: %s", strings.Join(args, " "), stderr.String())
		return stdout.String()
	}

	objs := decode(t, clusterctl("generate", "provider", "--infrastructure", "nstance:"+version))
	cmObj, ok := find(objs, "ConfigMap", release+"-config")
	require.True(t, ok)
	var cm corev1.ConfigMap
	into(t, cmObj, &cm)
	cfg, err := opconfig.Parse([]byte(cm.Data["config.yaml"]))
	require.NoError(t, err)
	require.Equal(t, "prod", cfg.ClusterID)
	require.Len(t, cfg.Shards, 2)
	require.Equal(t, "b.internal:8993", cfg.Shards["us-east-1b"].OperatorAddr)

	tmpl := decode(t, clusterctl("generate", "cluster", "prod", "--infrastructure", "nstance:"+version,
		"--target-namespace", "nstance-system", "--worker-machine-count", "2"))
	pool, ok := find(tmpl, "NstanceMachinePool", "")
	require.True(t, ok)
	var spec struct {
		Spec struct {
			Shards []string `json:"shards"`
		} `json:"spec"`
	}
	require.NoError(t, json.Unmarshal(pool.raw, &spec))
	require.Equal(t, []string{"us-east-1a", "us-east-1b"}, spec.Spec.Shards)
}
