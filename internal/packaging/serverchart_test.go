package packaging_test

import (
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nstance-dev/nstance/internal/server/app"
	"github.com/nstance-dev/nstance/internal/server/leaderaddr"
)

const (
	serverChartRel   = "deploy/helm/nstance-server"
	serverSampleRel  = "deploy/helm/nstance-server/ci/sample-values.yaml"
	serverMinimalRel = "deploy/helm/nstance-server/ci/minimal-values.yaml"
	serverRelease    = "nstance-server"
)

// serverRenderings are the ways of installing the server chart the tests
// check; shards is what each must produce.
type serverRendering struct {
	name      string
	namespace string
	args      []string
	shards    map[string]int32 // shard -> replicas
}

func serverRenderings() []serverRendering {
	return []serverRendering{
		{name: "minimal", namespace: "nstance-srv-default", args: []string{"-f", serverMinimalRel},
			shards: map[string]int32{"us-west-2a": 2}},
		{name: "sample", namespace: "nstance-srv-sample", args: []string{"-f", serverSampleRel},
			shards: map[string]int32{"us-west-2a": 2, "us-west-2b": 3}},
		{name: "existing-secret", namespace: "nstance-srv-secret", args: []string{
			"--set", "shards.eu-central-1a.zone=eu-central-1a", "--set", "storage.bucket=b",
			"--set", "encryptionKey.existingSecret=nstance-key", "--set", "probes.livenessPath=/healthz",
			"--set", "replicaCount=4", "--set", "podDisruptionBudget.minAvailable=2",
			"--set", "service.leaderOnly=false",
		}, shards: map[string]int32{"eu-central-1a": 4}},
	}
}

// leaderOnly reports whether the shard Services select only the leader.
func (r serverRendering) leaderOnly() bool {
	return !slices.Contains(r.args, "service.leaderOnly=false")
}

func (r serverRendering) render(t *testing.T) []object {
	t.Helper()
	args := append([]string{"template", serverRelease, serverChartRel, "--namespace", r.namespace}, r.args...)
	return decode(t, run(t, root, helm(t), args...))
}

func serverDeployment(t *testing.T, o object) (appsv1.Deployment, corev1.Container) {
	t.Helper()
	var d appsv1.Deployment
	into(t, o, &d)
	require.Len(t, d.Spec.Template.Spec.Containers, 1)
	return d, d.Spec.Template.Spec.Containers[0]
}

// serverEnvNames lists the variables the server containers get, from env
// and from the ConfigMaps they load.
func serverEnvNames(t *testing.T, objs []object) []string {
	t.Helper()
	var names []string
	for _, o := range ofKind(objs, "Deployment") {
		_, c := serverDeployment(t, o)
		for _, e := range c.Env {
			names = append(names, e.Name)
		}
		for _, from := range c.EnvFrom {
			require.NotNil(t, from.ConfigMapRef)
			cmObj, ok := find(objs, "ConfigMap", from.ConfigMapRef.Name)
			require.True(t, ok, "ConfigMap %s is not rendered", from.ConfigMapRef.Name)
			var cm corev1.ConfigMap
			into(t, cmObj, &cm)
			for k := range cm.Data {
				names = append(names, k)
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

func TestServerHelmLint(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"minimal values", []string{"-f", serverMinimalRel}},
		{"sample values", []string{"-f", serverSampleRel}},
		{"existing secret", serverRenderings()[2].args},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := run(t, root, helm(t), append([]string{"lint", "--strict", serverChartRel}, tc.args...)...)
			require.Contains(t, out, "0 chart(s) failed")
			require.NotContains(t, out, "[WARNING]")
			require.NotContains(t, out, "[ERROR]")
		})
	}
}

func TestServerHelmRejectsBadValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  []string
		want string
	}{
		{"unknown key", []string{"storage.bukket=x"}, "additional properties"},
		{"one server per shard", []string{"shards.a.replicas=1"}, "replicas"},
		{"no standby by default", []string{"replicaCount=1"}, "replicaCount"},
		{"shard ID not a DNS label", []string{"shards.Zone_A.zone=a"}, "'Zone_A' does not match pattern"},
		{"no bucket", []string{"shards.a.zone=a", "encryptionKey.value=k"}, "at '/storage/bucket': minLength"},
		{"no encryption key", []string{"shards.a.zone=a", "storage.bucket=b"}, "encryptionKey"},
		{"liveness path", []string{"probes.livenessPath=healthz"}, "livenessPath"},
		{"anti-affinity mode", []string{"podAntiAffinity=maybe"}, "podAntiAffinity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := []string{"template", serverRelease, serverChartRel}
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			out, err := execOut(root, helm(t), args...)
			require.Error(t, err, "helm accepted --set %v", tc.set)
			require.Contains(t, out, tc.want)
		})
	}
}

// servedPaths lists the GET paths the server's health port serves, read from
// internal/server/health (the probes must point at one of them).
func servedPaths(t *testing.T) []string {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(root, "internal", "server", "health", "health.go"))
	require.NoError(t, err)
	var paths []string
	for _, m := range regexp.MustCompile(`"GET (/[a-z]*)"`).FindAllStringSubmatch(string(src), -1) {
		paths = append(paths, m[1])
	}
	require.NotEmpty(t, paths)
	return paths
}

func TestServerChartRenders(t *testing.T) {
	served := servedPaths(t)
	for _, r := range serverRenderings() {
		t.Run(r.name, func(t *testing.T) {
			objs := r.render(t)
			if len(r.shards) == 0 {
				require.Empty(t, objs, "no shard configured: nothing to install")
				return
			}
			deps := ofKind(objs, "Deployment")
			require.Len(t, deps, len(r.shards), "one Deployment per shard")
			for _, o := range deps {
				d, c := serverDeployment(t, o)
				shard := d.Labels["nstance.dev/shard"]
				want, ok := r.shards[shard]
				require.True(t, ok, "Deployment %s for unknown shard %q", d.Name, shard)
				require.Equal(t, r.namespace, d.Namespace)
				require.NotNil(t, d.Spec.Replicas)
				require.Equal(t, want, *d.Spec.Replicas)
				require.GreaterOrEqual(t, *d.Spec.Replicas, int32(2), "a shard needs standbys")
				require.Equal(t, shard, d.Spec.Selector.MatchLabels["nstance.dev/shard"])
				require.Equal(t, intstr.FromInt32(0), *d.Spec.Strategy.RollingUpdate.MaxUnavailable)

				// Health probes on the health port, 8990.
				require.EqualValues(t, app.DefaultHealthPort, 8990)
				health := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "health" })
				require.GreaterOrEqual(t, health, 0)
				require.EqualValues(t, app.DefaultHealthPort, c.Ports[health].ContainerPort)
				require.Contains(t, c.Args, "--bind-health=0.0.0.0:8990")
				require.NotNil(t, c.ReadinessProbe.HTTPGet)
				require.Equal(t, intstr.FromString("health"), c.ReadinessProbe.HTTPGet.Port)
				require.Contains(t, served, c.ReadinessProbe.HTTPGet.Path, "readiness probe on a path the server does not serve")
				if lp := c.LivenessProbe.HTTPGet; lp != nil {
					require.Equal(t, intstr.FromString("health"), lp.Port)
					require.NotEqual(t, c.ReadinessProbe.HTTPGet.Path, lp.Path, "liveness must not fail when storage does")
				} else {
					require.NotNil(t, c.LivenessProbe.TCPSocket)
					require.Equal(t, intstr.FromString("health"), c.LivenessProbe.TCPSocket.Port)
				}
				// Every container port the Service targets exists.
				for _, name := range []string{"election", "registration", "operator", "agent"} {
					require.True(t, slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == name }), "port %s", name)
				}

				// Non-root, read-only, no token.
				ps := d.Spec.Template.Spec.SecurityContext
				require.True(t, *ps.RunAsNonRoot)
				require.EqualValues(t, 65532, *ps.RunAsUser)
				require.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
				require.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
				require.Equal(t, []corev1.Capability{"ALL"}, c.SecurityContext.Capabilities.Drop)
				// A token only to label the leader's pod.
				require.Equal(t, r.leaderOnly(), *d.Spec.Template.Spec.AutomountServiceAccountToken)

				// Two servers of a shard are kept off one node.
				aa := d.Spec.Template.Spec.Affinity.PodAntiAffinity
				var terms []corev1.PodAffinityTerm
				terms = append(terms, aa.RequiredDuringSchedulingIgnoredDuringExecution...)
				for _, w := range aa.PreferredDuringSchedulingIgnoredDuringExecution {
					terms = append(terms, w.PodAffinityTerm)
				}
				require.Len(t, terms, 1)
				require.Equal(t, "kubernetes.io/hostname", terms[0].TopologyKey)
				require.Equal(t, d.Spec.Selector.MatchLabels, terms[0].LabelSelector.MatchLabels)

				// A PDB and a Service for exactly this shard's pods.
				var pdb policyv1.PodDisruptionBudget
				pdbObj, ok := find(objs, "PodDisruptionBudget", d.Name)
				require.True(t, ok, "no PodDisruptionBudget for %s", d.Name)
				into(t, pdbObj, &pdb)
				require.Equal(t, d.Spec.Selector.MatchLabels, pdb.Spec.Selector.MatchLabels)
				require.Less(t, pdb.Spec.MinAvailable.IntValue(), int(*d.Spec.Replicas), "the PDB would block every drain")
				var svc corev1.Service
				svcObj, ok := find(objs, "Service", d.Name)
				require.True(t, ok, "no Service for %s", d.Name)
				into(t, svcObj, &svc)
				checkLeaderService(t, r, objs, d, c, svc)

				// The configuration: the shard, storage and the key.
				cmObj, ok := find(objs, "ConfigMap", d.Name)
				require.True(t, ok)
				var cm corev1.ConfigMap
				into(t, cmObj, &cm)
				require.Equal(t, shard, cm.Data["NSTANCE_SHARD"])
				require.NotEmpty(t, cm.Data["NSTANCE_STORAGE_BUCKET"])
				require.Contains(t, strings.Split(cm.Data["NSTANCE_ADVERTISE_HOST"], ","), d.Name+"."+r.namespace+".svc")
				var key *corev1.EnvVar
				for i := range c.Env {
					if c.Env[i].Name == "NSTANCE_ENCRYPTION_KEY" {
						key = &c.Env[i]
					}
				}
				require.NotNil(t, key)
				require.NotNil(t, key.ValueFrom.SecretKeyRef)
				if sec, ok := find(objs, "Secret", key.ValueFrom.SecretKeyRef.Name); ok {
					var s corev1.Secret
					into(t, sec, &s)
					require.NotEmpty(t, s.StringData[key.ValueFrom.SecretKeyRef.Key])
				} else {
					// encryptionKey.existingSecret of the existing-secret
					// rendering and of ci/minimal-values.yaml.
					require.Contains(t, []string{"nstance-key", "nstance-encryption-key"}, key.ValueFrom.SecretKeyRef.Name,
						"the key Secret is neither rendered nor the existing one")
				}
			}
		})
	}
}

// TestServerChartAppliesToAPIServer sends every rendering to a real
// kube-apiserver with --dry-run=server.
func TestServerChartAppliesToAPIServer(t *testing.T) {
	e := apiServer(t)
	for _, r := range serverRenderings() {
		if len(r.shards) == 0 {
			continue
		}
		t.Run(r.name, func(t *testing.T) {
			ensureNamespaces(t, e, r.namespace)
			applyDryRun(t, e, r.render(t))
		})
	}
}

// checkLeaderService: with service.leaderOnly (the default) the shard's
// Service selects the shard's pods carrying the label the leader puts on
// its own pod (leaderaddr.LeaderLabel, through --leader-pod set from the
// downward API), the pods may patch pods and nothing else, and a headless
// Service reaches every server, standbys and not-ready ones included, on
// the health and election ports. Without it the Service selects every
// server and the pods get no token.
func checkLeaderService(t *testing.T, r serverRendering, objs []object, d appsv1.Deployment, c corev1.Container, svc corev1.Service) {
	t.Helper()
	want := maps.Clone(d.Spec.Selector.MatchLabels)
	env := map[string]int{}
	for i, e := range c.Env {
		env[e.Name] = i
	}
	roleName := serverRelease + "-leader-label"
	role, hasRole := find(objs, "Role", roleName)
	if !r.leaderOnly() {
		require.Equal(t, want, svc.Spec.Selector)
		require.NotContains(t, env, "NSTANCE_LEADER_POD")
		require.False(t, hasRole)
	} else {
		want[leaderaddr.LeaderLabel] = "true"
		require.Equal(t, want, svc.Spec.Selector, "the Service must select only the leader")
		i, ok := env["NSTANCE_LEADER_POD"]
		require.True(t, ok)
		require.Equal(t, "$(POD_NAMESPACE)/$(POD_NAME)", c.Env[i].Value)
		// Kubernetes expands only variables defined earlier in the list.
		for name, path := range map[string]string{"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"} {
			j, ok := env[name]
			require.True(t, ok, name)
			require.Less(t, j, i, "%s must come before NSTANCE_LEADER_POD", name)
			require.Equal(t, path, c.Env[j].ValueFrom.FieldRef.FieldPath)
		}
		// The value the server parses once expanded.
		ns, pod, err := leaderaddr.ParsePodRef(r.namespace + "/" + d.Name + "-7d9f8b6c4-x2k8z")
		require.NoError(t, err)
		require.Equal(t, r.namespace, ns)
		require.NotEmpty(t, pod)

		require.True(t, hasRole)
		var rl rbacv1.Role
		into(t, role, &rl)
		require.Equal(t, []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"patch"}}}, rl.Rules)
		bindingObj, ok := find(objs, "RoleBinding", roleName)
		require.True(t, ok)
		var rb rbacv1.RoleBinding
		into(t, bindingObj, &rb)
		require.Equal(t, roleName, rb.RoleRef.Name)
		require.Equal(t, []rbacv1.Subject{{Kind: "ServiceAccount", Name: d.Spec.Template.Spec.ServiceAccountName, Namespace: r.namespace}}, rb.Subjects)
	}

	hlObj, ok := find(objs, "Service", d.Name+"-servers")
	require.True(t, ok, "no headless Service for %s", d.Name)
	var hl corev1.Service
	into(t, hlObj, &hl)
	require.Equal(t, corev1.ClusterIPNone, hl.Spec.ClusterIP)
	require.True(t, hl.Spec.PublishNotReadyAddresses, "standbys reachable before they are ready")
	require.Equal(t, d.Spec.Selector.MatchLabels, hl.Spec.Selector, "every server of the shard")
	var ports []string
	for _, p := range hl.Spec.Ports {
		ports = append(ports, p.Name+"="+p.TargetPort.String())
	}
	require.Equal(t, []string{"health=health", "election=election"}, ports)
}

// TestServerServiceAccountPermissions applies the minimal rendering for
// real and asks the API server, as the servers' ServiceAccount, for what
// labelling the leader's pod needs (patch pods in the release namespace)
// and for what it must not have.
func TestServerServiceAccountPermissions(t *testing.T) {
	e := apiServer(t)
	r := serverRenderings()[0]
	require.Equal(t, "minimal", r.name)
	const ns = "nstance-srv-sar"
	ensureNamespaces(t, e, ns)
	kubectl(t, e, run(t, root, helm(t), "template", serverRelease, serverChartRel, "--namespace", ns, "-f", serverMinimalRel), "apply", "-f", "-")
	sa := "system:serviceaccount:" + ns + ":" + serverRelease
	for _, tc := range []struct {
		a    access
		want bool
	}{
		{access{user: sa, namespace: ns, resource: "pods", verb: "patch", name: "nstance-server-us-west-2a-abc"}, true},
		{access{user: sa, namespace: ns, resource: "pods", verb: "delete", name: "nstance-server-us-west-2a-abc"}, false},
		{access{user: sa, namespace: ns, resource: "pods", verb: "list"}, false},
		{access{user: sa, namespace: ns, resource: "secrets", verb: "get", name: "nstance-encryption-key"}, false},
		{access{user: sa, namespace: "default", resource: "pods", verb: "patch", name: "other"}, false},
	} {
		require.Equal(t, tc.want, allowed(t, e, tc.a), "%s", tc.a)
	}
}
