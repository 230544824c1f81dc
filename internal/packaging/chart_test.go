package packaging_test

import (
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/nstance-dev/nstance/internal/operator/bootstrap"
	opconfig "github.com/nstance-dev/nstance/internal/operator/config"
	opmanager "github.com/nstance-dev/nstance/internal/operator/manager"
	opwebhook "github.com/nstance-dev/nstance/internal/operator/webhook"
)

const release = "nstance-operator"

// rendering is one way of installing the chart.
type rendering struct {
	name      string
	namespace string
	args      []string
	// workNamespace is NSTANCE_NAMESPACE when it differs from namespace.
	workNamespace string
	webhook       bool
	certManager   bool
}

func renderings() []rendering {
	return []rendering{
		{name: "minimal", namespace: "nstance-system", args: []string{"-f", minimalRel}, webhook: true},
		{name: "sample", namespace: "nstance-sample", args: []string{"-f", sampleRel},
			workNamespace: "nstance-workload", webhook: true},
		{name: "webhook-disabled", namespace: "nstance-nowebhook",
			args: []string{"--set", "webhook.enabled=false", "--set", "config.clusterID=c1",
				"--set", "config.shards.a.registrationAddr=a:1", "--set", "config.shards.a.operatorAddr=a:2"}},
		{name: "cert-manager", namespace: "nstance-certmanager", args: []string{"-f", minimalRel, "--api-versions", "cert-manager.io/v1"},
			webhook: true, certManager: true},
	}
}

func (r rendering) work() string {
	if r.workNamespace != "" {
		return r.workNamespace
	}
	return r.namespace
}

func render(t *testing.T, r rendering) []object {
	t.Helper()
	args := append([]string{"template", release, chartRel, "--namespace", r.namespace}, r.args...)
	return decode(t, run(t, root, helm(t), args...))
}

func TestHelmLint(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"minimal values", []string{"-f", minimalRel}},
		{"sample values", []string{"-f", sampleRel}},
		{"webhook disabled", []string{"-f", minimalRel, "--set", "webhook.enabled=false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := run(t, root, helm(t), append([]string{"lint", "--strict", chartRel}, tc.args...)...)
			require.Contains(t, out, "0 chart(s) failed")
			require.NotContains(t, out, "[WARNING]")
			require.NotContains(t, out, "[ERROR]")
		})
	}
}

func TestHelmSchemaRejectsBadValues(t *testing.T) {
	for _, tc := range []struct{ name, set, want string }{
		{"unknown key", "config.clusterId=x", "additional properties"},
		{"shard without operator address", "config.shards.a.registrationAddr=a:1", "operatorAddr"},
		{"cluster ID not a DNS label", "config.clusterID=Not_A_Label", "clusterID"},
		{"zero replicas", "replicaCount=0", "replicaCount"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := execOut(root, helm(t), "template", release, chartRel, "--set", tc.set)
			require.Error(t, err, "helm accepted --set %s", tc.set)
			require.Contains(t, out, tc.want)
		})
	}
}

// TestChartCopiesMatchConfig fails when the chart's copies of generated files
// (CRDs, operator RBAC) drift from config/: run `make helm-sync`.
func TestChartCopiesMatchConfig(t *testing.T) {
	chart := filepath.Join(root, chartRel, "files")
	bases, err := filepath.Glob(filepath.Join(root, "config", "crd", "bases", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, bases)
	copies, err := filepath.Glob(filepath.Join(chart, "crds", "*.yaml"))
	require.NoError(t, err)
	names := func(paths []string) []string {
		var out []string
		for _, p := range paths {
			out = append(out, filepath.Base(p))
		}
		return out
	}
	require.Equal(t, names(bases), names(copies), "chart CRD set differs from config/crd/bases: run `make helm-sync`")
	for _, b := range bases {
		want, err := os.ReadFile(b)
		require.NoError(t, err)
		got, err := os.ReadFile(filepath.Join(chart, "crds", filepath.Base(b)))
		require.NoError(t, err)
		require.Equal(t, string(want), string(got), "%s differs from config/crd/bases: run `make helm-sync`", filepath.Base(b))
	}

	generated := filepath.Join(root, "config", "rbac", "role.yaml")
	want, err := os.ReadFile(generated)
	require.NoError(t, err, "config/rbac/role.yaml is generated from the operator's markers: run `make generate`")
	got, err := os.ReadFile(filepath.Join(chart, "rbac", "role.yaml"))
	require.NoError(t, err)
	require.Equal(t, string(want), string(got), "chart RBAC differs from config/rbac/role.yaml: run `make helm-sync`")
}

// generatedRoles reads the operator's marker-generated RBAC as the chart
// uses it: the ClusterRole's rules and the rules of the Role generated from
// the markers with namespace=, which apply in the operator's namespace.
func generatedRoles(t *testing.T) (cluster, namespaced []rbacv1.PolicyRule) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, chartRel, "files", "rbac", "role.yaml"))
	require.NoError(t, err)
	for doc := range strings.SplitSeq(string(data), "\n---\n") {
		var role rbacv1.ClusterRole
		require.NoError(t, yaml.UnmarshalStrict([]byte(doc), &role))
		switch role.Kind {
		case "ClusterRole":
			cluster = role.Rules
		case "Role":
			require.Equal(t, opmanager.RoleNamespace, role.Namespace)
			namespaced = role.Rules
		}
	}
	require.NotEmpty(t, cluster)
	require.NotEmpty(t, namespaced)
	return cluster, namespaced
}

func TestChartRenders(t *testing.T) {
	for _, r := range renderings() {
		t.Run(r.name, func(t *testing.T) {
			objs := render(t, r)
			checkDeployment(t, r, objs)
			checkConfig(t, r, objs)
			checkRBAC(t, r, objs)
			checkWebhook(t, r, objs)
			checkCRDs(t, objs)
		})
	}
}

func deployment(t *testing.T, objs []object) (appsv1.Deployment, corev1.Container) {
	t.Helper()
	o, ok := find(objs, "Deployment", release)
	require.True(t, ok, "no Deployment %s", release)
	var d appsv1.Deployment
	into(t, o, &d)
	require.Len(t, d.Spec.Template.Spec.Containers, 1)
	return d, d.Spec.Template.Spec.Containers[0]
}

func checkDeployment(t *testing.T, r rendering, objs []object) {
	d, c := deployment(t, objs)
	pod := d.Spec.Template.Spec
	require.NotNil(t, d.Spec.Replicas)
	require.EqualValues(t, 2, *d.Spec.Replicas)
	require.Contains(t, c.Args, "--leader-elect")
	require.Contains(t, c.Args, "--health-probe-bind-address=:8081")
	require.Contains(t, c.Args, "--diagnostics-address=:8443")
	require.NotContains(t, c.Args, "--insecure-diagnostics", "secure diagnostics by default")
	require.Contains(t, c.Args, "--config="+opconfig.DefaultPath)
	require.Equal(t, !r.webhook, slices.Contains(c.Args, "--disable-webhooks"))
	require.Equal(t, r.webhook, slices.Contains(c.Args, "--webhook-port=9443"))
	require.Equal(t, r.webhook, slices.Contains(c.Args, "--webhook-cert-dir=/tmp/k8s-webhook-server/serving-certs"))
	level := "info"
	if r.name == "sample" {
		level = "debug"
	}
	require.Contains(t, c.Args, "--log-level="+level)
	for _, a := range c.Args {
		require.False(t, strings.HasPrefix(a, "--log-format"), "the image's NSTANCE_LOG_FORMAT=json decides the format: %s", a)
	}
	require.Subset(t, d.Spec.Template.Labels, d.Spec.Selector.MatchLabels)

	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	require.EqualValues(t, 8081, ports["health"])
	require.EqualValues(t, 8443, ports["metrics"])
	for probe, path := range map[*corev1.Probe]string{c.LivenessProbe: "/healthz", c.ReadinessProbe: "/readyz"} {
		require.NotNil(t, probe)
		require.Equal(t, path, probe.HTTPGet.Path)
		require.Equal(t, "health", probe.HTTPGet.Port.String())
	}

	// Non-root, read-only, no capabilities, default seccomp.
	psc := pod.SecurityContext
	require.NotNil(t, psc)
	require.True(t, *psc.RunAsNonRoot)
	require.EqualValues(t, 65532, *psc.RunAsUser)
	require.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, psc.SeccompProfile.Type)
	sc := c.SecurityContext
	require.NotNil(t, sc)
	require.False(t, *sc.AllowPrivilegeEscalation)
	require.True(t, *sc.ReadOnlyRootFilesystem)
	require.True(t, *sc.RunAsNonRoot)
	require.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop)
	require.Empty(t, sc.Capabilities.Add)

	// Every volume defined once and mounted once; every mount has a volume.
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		_, dup := volumes[v.Name]
		require.False(t, dup, "volume %s defined twice", v.Name)
		volumes[v.Name] = v
	}
	mounted, paths := map[string]bool{}, map[string]bool{}
	for _, m := range c.VolumeMounts {
		require.Contains(t, volumes, m.Name, "mount of undefined volume %s", m.Name)
		require.False(t, mounted[m.Name], "volume %s mounted twice", m.Name)
		require.False(t, paths[m.MountPath], "two mounts at %s", m.MountPath)
		mounted[m.Name], paths[m.MountPath] = true, true
	}
	for name := range volumes {
		require.True(t, mounted[name], "volume %s never mounted", name)
	}
	cfg := volumes["config"]
	require.NotNil(t, cfg.ConfigMap)
	_, ok := find(objs, "ConfigMap", cfg.ConfigMap.Name)
	require.True(t, ok, "config volume points at missing ConfigMap %s", cfg.ConfigMap.Name)
	require.True(t, paths[filepath.Dir(opconfig.DefaultPath)])
	certs, hasCerts := volumes["webhook-certs"]
	require.Equal(t, r.webhook, hasCerts)
	if hasCerts {
		require.True(t, paths["/tmp/k8s-webhook-server/serving-certs"], "controller-runtime's default cert dir")
		require.True(t, secretProvided(t, objs, certs.Secret.SecretName), "no Secret or Certificate provides %s", certs.Secret.SecretName)
	}

	// The environment names what the operator reads, with the seed's defaults.
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
		if e.ValueFrom != nil {
			require.Equal(t, "metadata.namespace", e.ValueFrom.FieldRef.FieldPath)
			env[e.Name] = r.namespace
		}
	}
	parsed, err := opconfig.ParseEnv(func(k string) string { return env[k] }, func() (string, error) { return r.namespace, nil })
	require.NoError(t, err)
	require.Equal(t, r.work(), parsed.Namespace)
	require.Equal(t, opconfig.DefaultCAConfigMap, parsed.CAConfigMap)
	require.Equal(t, opconfig.DefaultNonceSecret, parsed.NonceSecret)
	require.Equal(t, opconfig.DefaultCertSecret, parsed.CertSecret)
	require.Equal(t, opconfig.DefaultKeySecret, parsed.KeySecret)
	require.Equal(t, opconfig.DefaultCAPIServiceAccount, parsed.CAPIServiceAccount)
	for name := range env {
		require.True(t, strings.HasPrefix(name, "NSTANCE_"), "unexpected env %s", name)
	}
	require.NotContains(t, env, "NSTANCE_LOG_FORMAT", "the image's JSON format stays in force")
	require.Equal(t, pod.ServiceAccountName, release)
	_, ok = find(objs, "ServiceAccount", pod.ServiceAccountName)
	require.True(t, ok)
}

func secretProvided(t *testing.T, objs []object, name string) bool {
	if _, ok := find(objs, "Secret", name); ok {
		return true
	}
	for _, o := range ofKind(objs, "Certificate") {
		var cert struct {
			Spec struct {
				SecretName string `json:"secretName"`
			} `json:"spec"`
		}
		require.NoError(t, yaml.Unmarshal(o.raw, &cert))
		if cert.Spec.SecretName == name {
			return true
		}
	}
	return false
}

func checkConfig(t *testing.T, r rendering, objs []object) {
	o, ok := find(objs, "ConfigMap", release+"-config")
	require.True(t, ok)
	var cm corev1.ConfigMap
	into(t, o, &cm)
	cfg, err := opconfig.Parse([]byte(cm.Data["config.yaml"]))
	// Defaults do not render (TestChartsRequireValues): every rendering's
	// config is one the operator accepts.
	require.NoError(t, err, "operator rejects the rendered config:\n%s", cm.Data["config.yaml"])
	require.NotEmpty(t, cfg.Shards)
	if r.name != "sample" {
		return
	}
	require.Equal(t, "example-cluster", cfg.ClusterID)
	require.Equal(t, []string{"us-east-1a", "us-west-2a"}, cfg.ShardIDs())
	require.Equal(t, "10.0.0.1:8993", cfg.Shards["us-west-2a"].OperatorAddr)

	// The sample provisions the CA and nonce with the keys the operator reads.
	caObj, ok := find(objs, "ConfigMap", opconfig.DefaultCAConfigMap)
	require.True(t, ok)
	require.Equal(t, r.work(), caObj.Metadata.Namespace)
	var ca corev1.ConfigMap
	into(t, caObj, &ca)
	block, _ := pem.Decode([]byte(ca.Data[bootstrap.CAKey]))
	require.NotNil(t, block, "ConfigMap key %s holds no PEM", bootstrap.CAKey)
	caCert, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	require.True(t, caCert.IsCA)
	nonceObj, ok := find(objs, "Secret", opconfig.DefaultNonceSecret)
	require.True(t, ok)
	require.Equal(t, r.work(), nonceObj.Metadata.Namespace)
	var nonce corev1.Secret
	into(t, nonceObj, &nonce)
	require.Len(t, strings.Split(nonce.StringData[bootstrap.NonceKey], "."), 3, "Secret key %s holds no JWT", bootstrap.NonceKey)
}

func checkRBAC(t *testing.T, r rendering, objs []object) {
	// The manager ClusterRole is exactly the marker-generated one.
	o, ok := find(objs, "ClusterRole", release+"-manager")
	require.True(t, ok)
	var manager rbacv1.ClusterRole
	into(t, o, &manager)
	clusterRules, namespacedRules := generatedRoles(t)
	require.Equal(t, clusterRules, manager.Rules)
	// Secrets and ServiceAccount tokens are never granted cluster-wide.
	for _, rule := range manager.Rules {
		for _, res := range rule.Resources {
			require.NotContains(t, []string{"secrets", "serviceaccounts", "serviceaccounts/token"}, res, "cluster-wide rule %+v", rule)
		}
	}
	// The namespaced Role is the generated one, in the managed namespace,
	// bound to the operator.
	o, ok = find(objs, "Role", release+"-manager")
	require.True(t, ok)
	require.Equal(t, r.work(), o.Metadata.Namespace)
	var nsRole rbacv1.Role
	into(t, o, &nsRole)
	require.Equal(t, namespacedRules, nsRole.Rules)
	o, ok = find(objs, "RoleBinding", release+"-manager")
	require.True(t, ok)
	require.Equal(t, r.work(), o.Metadata.Namespace)

	// Nothing grants a wildcard.
	for _, kind := range []string{"ClusterRole", "Role"} {
		for _, o := range ofKind(objs, kind) {
			var role rbacv1.ClusterRole
			into(t, o, &role)
			for _, rule := range role.Rules {
				for _, list := range [][]string{rule.Verbs, rule.Resources, rule.APIGroups} {
					require.NotContains(t, list, "*", "%s grants a wildcard: %+v", o, rule)
				}
			}
		}
	}
	// Every binding points at a rendered role and a rendered ServiceAccount.
	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		for _, o := range ofKind(objs, kind) {
			var b rbacv1.RoleBinding
			into(t, o, &b)
			ok := slices.ContainsFunc(ofKind(objs, b.RoleRef.Kind), func(role object) bool {
				return role.Metadata.Name == b.RoleRef.Name && (kind == "ClusterRoleBinding" || role.Metadata.Namespace == o.Metadata.Namespace)
			})
			require.True(t, ok, "%s in %q refers to missing %s %s", o, o.Metadata.Namespace, b.RoleRef.Kind, b.RoleRef.Name)
			for _, s := range b.Subjects {
				sa, ok := find(objs, "ServiceAccount", s.Name)
				require.True(t, ok, "%s binds missing ServiceAccount %s", o, s.Name)
				require.Equal(t, s.Namespace, sa.Metadata.Namespace)
			}
		}
	}
	capi, ok := find(objs, "ServiceAccount", opconfig.DefaultCAPIServiceAccount)
	require.True(t, ok, "CAPI workload ServiceAccount")
	require.Equal(t, r.work(), capi.Metadata.Namespace)
}

func checkWebhook(t *testing.T, r rendering, objs []object) {
	vwcObj, ok := find(objs, "ValidatingWebhookConfiguration", "")
	require.Equal(t, r.webhook, ok)
	_, svcOK := find(objs, "Service", release+"-webhook")
	require.Equal(t, r.webhook, svcOK)
	require.Equal(t, r.certManager, len(ofKind(objs, "Certificate")) == 1)
	require.Equal(t, r.certManager, len(ofKind(objs, "Issuer")) == 1)
	if !r.webhook {
		_, ok := find(objs, "Secret", release+"-webhook-tls")
		require.False(t, ok)
		return
	}
	var vwc admissionv1.ValidatingWebhookConfiguration
	into(t, vwcObj, &vwc)
	require.Len(t, vwc.Webhooks, 2)
	wh := vwc.Webhooks[0]
	require.Equal(t, []string{"nstancemachinepools"}, wh.Rules[0].Resources)
	require.Equal(t, []string{"infrastructure.cluster.x-k8s.io"}, wh.Rules[0].APIGroups)
	// Static pools' MachinePools only, selected by label.
	mpw := vwc.Webhooks[1]
	require.Equal(t, []string{"machinepools"}, mpw.Rules[0].Resources)
	require.Equal(t, []string{"cluster.x-k8s.io"}, mpw.Rules[0].APIGroups)
	require.Equal(t, opwebhook.MachinePoolPath, *mpw.ClientConfig.Service.Path)
	require.Equal(t, map[string]string{opwebhook.StaticLabel: "true"}, mpw.ObjectSelector.MatchLabels)
	require.Equal(t, wh.ClientConfig.Service.Name, mpw.ClientConfig.Service.Name)
	require.Equal(t, wh.ClientConfig.CABundle, mpw.ClientConfig.CABundle)
	svc := wh.ClientConfig.Service
	require.NotNil(t, svc)
	require.Equal(t, release+"-webhook", svc.Name)
	require.Equal(t, r.namespace, svc.Namespace)

	// The Service reaches the container's webhook port.
	svcObj, _ := find(objs, "Service", svc.Name)
	var service corev1.Service
	into(t, svcObj, &service)
	require.Equal(t, "webhook", service.Spec.Ports[0].TargetPort.String())
	_, c := deployment(t, objs)
	require.True(t, slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "webhook" && p.ContainerPort == 9443 }))
	require.Contains(t, c.Args, "--webhook-port=9443", "the operator listens where the container port and the Service point")

	if r.certManager {
		require.Empty(t, wh.ClientConfig.CABundle)
		require.Equal(t, r.namespace+"/"+release+"-webhook", vwc.Annotations["cert-manager.io/inject-ca-from"])
		return
	}
	// The generated CA in caBundle verifies the serving certificate for the
	// Service's DNS name.
	secObj, ok := find(objs, "Secret", release+"-webhook-tls")
	require.True(t, ok)
	var sec corev1.Secret
	into(t, secObj, &sec)
	require.Equal(t, corev1.SecretTypeTLS, sec.Type)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(wh.ClientConfig.CABundle))
	block, _ := pem.Decode(sec.Data["tls.crt"])
	require.NotNil(t, block)
	leaf, err := x509.ParseCertificate(block.Bytes)
	require.NoError(t, err)
	_, err = leaf.Verify(x509.VerifyOptions{
		DNSName:   svc.Name + "." + svc.Namespace + ".svc",
		Roots:     pool,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	require.NoError(t, err)
	require.NotEmpty(t, sec.Data["tls.key"])
	require.Equal(t, base64.StdEncoding.EncodeToString(sec.Data["ca.crt"]), base64.StdEncoding.EncodeToString(wh.ClientConfig.CABundle))
}

func checkCRDs(t *testing.T, objs []object) {
	crds := ofKind(objs, "CustomResourceDefinition")
	bases, err := filepath.Glob(filepath.Join(root, chartRel, "files", "crds", "*.yaml"))
	require.NoError(t, err)
	require.Len(t, crds, len(bases))
	for _, o := range crds {
		require.Equal(t, "keep", o.Metadata.Annotations["helm.sh/resource-policy"], "%s would be deleted on uninstall", o)
		require.Equal(t, "v1beta1", o.Metadata.Labels["cluster.x-k8s.io/v1beta2"], "%s lacks the CAPI contract label", o)
		var crd apiextensionsv1.CustomResourceDefinition
		into(t, o, &crd)
		require.Contains(t, []string{"infrastructure.cluster.x-k8s.io", "controlplane.cluster.x-k8s.io"}, crd.Spec.Group)
	}
}
