package capicontract_test

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/ptr"
	clusterv1beta1 "sigs.k8s.io/cluster-api/api/core/v1beta1" //nolint:staticcheck // CAPI's conversion webhooks need the old types
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	capimachinedeployment "sigs.k8s.io/cluster-api/core/reconcilers/machinedeployment"
	capimachineset "sigs.k8s.io/cluster-api/core/reconcilers/machineset"
	coreadmission "sigs.k8s.io/cluster-api/core/webhooks/admission"
	"sigs.k8s.io/cluster-api/util/conditions"
	capiyaml "sigs.k8s.io/cluster-api/util/yaml"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	opwebhook "github.com/nstance-dev/nstance/internal/operator/webhook"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// withMachineDeployments adds core CAPI's MachineDeployment and MachineSet
// controllers (with every MachineSet preflight check, as clusterctl's
// default installation runs them) to startCAPI.
func withMachineDeployments(ctx context.Context, mgr ctrl.Manager, cc clustercache.ClusterCache, opts controller.Options) error {
	if err := (&capimachinedeployment.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader()}).
		SetupWithManager(ctx, mgr, opts); err != nil {
		return err
	}
	return (&capimachineset.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: cc,
		PreflightChecks: sets.New(clusterv1.MachineSetPreflightCheckAll)}).SetupWithManager(ctx, mgr, opts)
}

// startAdmissionWebhooks serves core CAPI's admission webhooks (defaulting
// and validation of Clusters, Machines, MachineSets, MachineDeployments and
// MachinePools, configured from the cluster-api module's
// core/config/webhook/manifests.yaml) and the operator's, and registers them
// with the API server for namespace ns only, until the test ends: objects
// there are admitted as in a management cluster with CAPI installed.
func startAdmissionWebhooks(t *testing.T, ns string) {
	t.Helper()
	root, err := kubetest.RepoRoot()
	require.NoError(t, err)
	crdDir, err := kubetest.CAPICRDDir(root)
	require.NoError(t, err)
	fail := ptr.To(admissionv1.Fail)
	none := ptr.To(admissionv1.SideEffectClassNone)
	ours := &admissionv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "nstance-operator-validating"},
		Webhooks: []admissionv1.ValidatingWebhook{{
			Name: "validation.nstancemachinepool.infrastructure.cluster.x-k8s.io", AdmissionReviewVersions: []string{"v1"},
			SideEffects: none, FailurePolicy: fail,
			ClientConfig: admissionv1.WebhookClientConfig{Service: &admissionv1.ServiceReference{Name: "svc", Namespace: "default", Path: ptr.To(opwebhook.Path)}},
			Rules: []admissionv1.RuleWithOperations{{Operations: []admissionv1.OperationType{admissionv1.Create, admissionv1.Update},
				Rule: admissionv1.Rule{APIGroups: []string{infrav1.GroupVersion.Group}, APIVersions: []string{"v1beta1"}, Resources: []string{"nstancemachinepools"}}}},
		}, {
			Name: "validation.machinepool.static.nstance.dev", AdmissionReviewVersions: []string{"v1"},
			SideEffects: none, FailurePolicy: fail,
			ClientConfig:   admissionv1.WebhookClientConfig{Service: &admissionv1.ServiceReference{Name: "svc", Namespace: "default", Path: ptr.To(opwebhook.MachinePoolPath)}},
			ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{opwebhook.StaticLabel: "true"}},
			Rules: []admissionv1.RuleWithOperations{{Operations: []admissionv1.OperationType{admissionv1.Update},
				Rule: admissionv1.Rule{APIGroups: []string{clusterv1.GroupVersion.Group}, APIVersions: []string{"v1beta2"}, Resources: []string{"machinepools"}}}},
		}},
	}
	wo := &envtest.WebhookInstallOptions{
		Paths:              []string{filepath.Join(filepath.Dir(filepath.Dir(crdDir)), "webhook", "manifests.yaml")},
		ValidatingWebhooks: []*admissionv1.ValidatingWebhookConfiguration{ours},
	}
	// Certificates, and every clientConfig pointed at the local server.
	require.NoError(t, wo.PrepWithoutInstalling())
	t.Cleanup(func() { _ = wo.Cleanup() })
	require.NotEmpty(t, wo.MutatingWebhooks, "core CAPI's defaulting webhooks")
	only := &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}}
	ctx := context.Background()
	var created []client.Object
	for _, m := range wo.MutatingWebhooks {
		m.Name += "-" + ns
		for i := range m.Webhooks {
			m.Webhooks[i].NamespaceSelector = only
		}
		created = append(created, m)
	}
	for _, v := range wo.ValidatingWebhooks {
		v.Name += "-" + ns
		for i := range v.Webhooks {
			v.Webhooks[i].NamespaceSelector = only
		}
		created = append(created, v)
	}

	// CAPI's webhooks also convert from v1beta1, so they need its types.
	scheme, err := kubetest.NewScheme()
	require.NoError(t, err)
	require.NoError(t, clusterv1beta1.AddToScheme(scheme))
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller:    config.Controller{SkipNameValidation: ptr.To(true)},
		WebhookServer: webhook.NewServer(webhook.Options{Host: wo.LocalServingHost, Port: wo.LocalServingPort, CertDir: wo.LocalServingCertDir}),
	})
	require.NoError(t, err)
	for _, setup := range []func(ctrl.Manager) error{
		(&coreadmission.Cluster{Client: mgr.GetClient()}).SetupWebhookWithManager,
		(&coreadmission.Machine{}).SetupWebhookWithManager,
		(&coreadmission.MachineSet{}).SetupWebhookWithManager,
		(&coreadmission.MachineDeployment{}).SetupWebhookWithManager,
		(&coreadmission.MachinePool{}).SetupWebhookWithManager,
		opwebhook.Setup,
	} {
		require.NoError(t, setup(mgr))
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		for _, o := range created {
			_ = env.Client.Delete(context.Background(), o)
		}
		cancel()
		<-done
	})
	require.Eventually(t, func() bool { return mgr.GetWebhookServer().StartedChecker()(nil) == nil },
		waitLong, tick, "webhook server serving")
	for _, o := range created {
		require.NoError(t, env.Client.Create(ctx, o))
	}
}

// clusterctl is the clusterctl binary built from the cluster-api module in
// go.mod, run with an empty configuration and no network.
type clusterctl struct {
	bin, home, root string
}

func buildClusterctl(t *testing.T) *clusterctl {
	t.Helper()
	root, err := kubetest.RepoRoot()
	require.NoError(t, err)
	goBin, err := exec.LookPath("go")
	require.NoError(t, err, "the go command builds clusterctl")
	dir := t.TempDir()
	bin := filepath.Join(dir, "clusterctl")
	cmd := exec.Command(goBin, "build", "-o", bin, "sigs.k8s.io/cluster-api/cmd/clusterctl")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build clusterctl: %s", out)
	home := filepath.Join(dir, "home")
	require.NoError(t, os.Mkdir(home, 0o700))
	return &clusterctl{bin: bin, home: home, root: root}
}

// command runs `clusterctl generate cluster name --from templates/file
// --target-namespace ns args...` with exactly vars as the environment, plus
// an empty home (no clusterctl.yaml) and no version check against GitHub.
func (c *clusterctl) command(file, name, ns string, vars map[string]string, args ...string) *exec.Cmd {
	cmd := exec.Command(c.bin, append([]string{"generate", "cluster", name,
		"--from", filepath.Join(c.root, "templates", file), "--target-namespace", ns}, args...)...)
	cmd.Env = []string{"HOME=" + c.home, "XDG_CONFIG_HOME=" + c.home, "CLUSTERCTL_DISABLE_VERSIONCHECK=true"}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	return cmd
}

// generate renders a template with workers worker machines and returns
// stdout and stderr.
func (c *clusterctl) generate(t *testing.T, file, name, ns string, workers int, vars map[string]string) (string, string, error) {
	t.Helper()
	cmd := c.command(file, name, ns, vars, "--worker-machine-count", strconv.Itoa(workers))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// render generates and parses a template; it fails the test when clusterctl
// does.
func (c *clusterctl) render(t *testing.T, file, name, ns string, workers int, vars map[string]string) []unstructured.Unstructured {
	t.Helper()
	out, stderr, err := c.generate(t, file, name, ns, workers, vars)
	require.NoError(t, err, "clusterctl generate cluster --from %s: %s", file, stderr)
	objs, err := capiyaml.ToUnstructured([]byte(out))
	require.NoError(t, err)
	require.NotEmpty(t, objs)
	for _, o := range objs {
		require.NotContains(t, o.GetName(), "${", "every variable substituted")
	}
	return objs
}

func kinds(objs []unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetKind())
	}
	return out
}

// apply applies every object with server-side apply as field manager
// "clusterctl-template", as `kubectl apply --server-side` would, without
// forcing ownership: a value another manager owns is a conflict.
func apply(ctx context.Context, objs []unstructured.Unstructured, opts ...client.ApplyOption) error {
	for i := range objs {
		o := objs[i].DeepCopy()
		all := append([]client.ApplyOption{client.FieldOwner("clusterctl-template")}, opts...)
		if err := env.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), all...); err != nil {
			return fmt.Errorf("apply %s %s: %w", o.GetKind(), o.GetName(), err)
		}
	}
	return nil
}

// TestClusterctlTemplates renders templates/cluster-template.yaml (the
// MachinePool flavour) and templates/cluster-template-machinedeployment.yaml
// with clusterctl built from the cluster-api module: a missing required
// variable fails naming it; the rendered objects pass the API server's
// validation and core CAPI's and the operator's admission webhooks in a
// server-side dry-run (which creates nothing, and refuses a bad variable or
// an object CAPI's webhook rejects); applied for real beside core CAPI's
// controllers and the operator, both Clusters become Available and their
// workers Ready.
func TestClusterctlTemplates(t *testing.T) {
	ctx := context.Background()
	cc := buildClusterctl(t)
	f := newFixture(t)
	u, err := url.Parse(env.Config.Host)
	require.NoError(t, err)
	common := map[string]string{"NSTANCE_CONTROL_PLANE_HOST": u.Hostname(), "NSTANCE_CONTROL_PLANE_PORT": u.Port()}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range common {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	const mdCluster = "tmpl-md"

	t.Run("every variable is documented in templates/README.md", func(t *testing.T) {
		readme, err := os.ReadFile(filepath.Join(cc.root, "templates", "README.md"))
		require.NoError(t, err)
		for _, file := range []string{"cluster-template.yaml", "cluster-template-machinedeployment.yaml"} {
			out, err := cc.command(file, "x", "x", nil, "--list-variables").CombinedOutput()
			require.NoError(t, err, "%s", out)
			var vars []string
			for line := range strings.SplitSeq(string(out), "\n") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "- "); ok {
					vars = append(vars, strings.Fields(v)[0])
				}
			}
			require.Contains(t, vars, "NSTANCE_CONTROL_PLANE_HOST", "%s", out)
			for _, v := range vars {
				require.Contains(t, string(readme), "| `"+v+"` |", "%s uses %s, which templates/README.md does not document", file, v)
			}
		}
	})

	t.Run("from a release: clusterctl finds both flavours by provider name", func(t *testing.T) {
		// A local provider repository laid out as a release (make
		// release-manifests publishes these files side by side), named in
		// clusterctl.yaml as templates/README.md says.
		repo := filepath.Join(t.TempDir(), "infrastructure-nstance", "v0.1.0")
		require.NoError(t, os.MkdirAll(repo, 0o755))
		for _, src := range []string{"templates/cluster-template.yaml", "templates/cluster-template-machinedeployment.yaml", "metadata.yaml"} {
			data, err := os.ReadFile(filepath.Join(cc.root, src))
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(repo, filepath.Base(src)), data, 0o644))
		}
		components := filepath.Join(repo, "infrastructure-components.yaml")
		require.NoError(t, os.WriteFile(components, []byte("---\n"), 0o644))
		home := t.TempDir()
		require.NoError(t, os.MkdirAll(filepath.Join(home, "cluster-api"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(home, "cluster-api", "clusterctl.yaml"), []byte(
			"providers:\n  - name: nstance\n    type: InfrastructureProvider\n    url: "+components+"\n"), 0o644))
		for flavor, want := range map[string]string{"": "MachinePool", "machinedeployment": "MachineDeployment"} {
			cmd := exec.Command(cc.bin, "generate", "cluster", "rel", "--infrastructure", "nstance:v0.1.0",
				"--flavor", flavor, "--target-namespace", "x")
			cmd.Env = []string{"HOME=" + home, "XDG_CONFIG_HOME=" + home, "CLUSTERCTL_DISABLE_VERSIONCHECK=true",
				"NSTANCE_CONTROL_PLANE_HOST=h", "NSTANCE_SHARDS=a", "NSTANCE_SHARD=a"}
			out, err := cmd.Output()
			require.NoError(t, err, "flavor %q", flavor)
			objs, err := capiyaml.ToUnstructured(out)
			require.NoError(t, err)
			require.Contains(t, kinds(objs), want, "flavor %q", flavor)
		}
	})

	t.Run("missing required variables fail naming them", func(t *testing.T) {
		_, stderr, err := cc.generate(t, "cluster-template.yaml", clusterID, f.ns, 2, map[string]string{})
		require.Error(t, err)
		require.Contains(t, stderr, "NSTANCE_CONTROL_PLANE_HOST, NSTANCE_SHARDS] is not set")
		_, stderr, err = cc.generate(t, "cluster-template-machinedeployment.yaml", mdCluster, f.ns, 2, common)
		require.Error(t, err)
		require.Contains(t, stderr, "[NSTANCE_SHARD] is not set")
	})

	mp := cc.render(t, "cluster-template.yaml", clusterID, f.ns, 2, with("NSTANCE_SHARDS", shardID))
	require.Equal(t, []string{"Cluster", "NstanceCluster", "NstanceControlPlane", "MachinePool", "NstanceMachinePool"}, kinds(mp))
	md := cc.render(t, "cluster-template-machinedeployment.yaml", mdCluster, f.ns, 2, with("NSTANCE_SHARD", shardID))
	require.Equal(t, []string{"Cluster", "NstanceCluster", "NstanceControlPlane", "NstanceShardGroup",
		"NstanceMachineTemplate", "MachineDeployment"}, kinds(md))
	for _, o := range append(append([]unstructured.Unstructured{}, mp...), md...) {
		require.Equal(t, f.ns, o.GetNamespace(), "%s %s", o.GetKind(), o.GetName())
	}

	startAdmissionWebhooks(t, f.ns)
	t.Run("server-side dry-run accepts the objects and creates nothing", func(t *testing.T) {
		for _, objs := range [][]unstructured.Unstructured{mp, md} {
			require.NoError(t, apply(ctx, objs, client.DryRunAll))
			for _, o := range objs {
				got := &unstructured.Unstructured{}
				got.SetGroupVersionKind(o.GroupVersionKind())
				err := env.Client.Get(ctx, client.ObjectKeyFromObject(&o), got)
				require.True(t, apierrors.IsNotFound(err), "%s %s exists after a dry-run: %v", o.GetKind(), o.GetName(), err)
			}
		}
		// The dry-run validates: a shard ID that is no DNS label is refused.
		bad := cc.render(t, "cluster-template.yaml", clusterID, f.ns, 2, with("NSTANCE_SHARDS", "Shard_A"))
		err := apply(ctx, bad, client.DryRunAll)
		require.Error(t, err)
		require.True(t, apierrors.IsInvalid(err), "%v", err)
		require.Contains(t, err.Error(), "spec.shards")

		// And core CAPI's webhooks admit: a MachineDeployment whose selector
		// its template does not match is theirs to refuse.
		broken := make([]unstructured.Unstructured, 0, len(md))
		for _, o := range md {
			o = *o.DeepCopy()
			if o.GetKind() == "MachineDeployment" {
				require.NoError(t, unstructured.SetNestedField(o.Object, "x", "spec", "selector", "matchLabels", "extra"))
			}
			broken = append(broken, o)
		}
		err = apply(ctx, broken, client.DryRunAll)
		require.Error(t, err)
		require.Contains(t, err.Error(), `admission webhook "validation.machinedeployment.cluster.x-k8s.io" denied the request`)
	})

	t.Run("applied beside core CAPI, the Clusters become Available and the workers Ready", func(t *testing.T) {
		bindCAPIWorkloadRole(t, f.ns)
		logs := &capiLog{}
		startCAPI(t, f.ns, logs.logger(), withMachineDeployments)
		t.Cleanup(func() {
			if t.Failed() {
				for _, line := range logs.matching("rror") {
					t.Log(line)
				}
			}
		})
		require.NoError(t, apply(ctx, mp))
		require.NoError(t, apply(ctx, md))
		// The templates declare the Clusters; the operator creates none, and
		// its startup import waits for its own.
		startOperatorOnly(t, f.opts)
		key := func(name string) client.ObjectKey { return client.ObjectKey{Namespace: f.ns, Name: name} }

		for _, name := range []string{clusterID, mdCluster} {
			var cluster clusterv1.Cluster
			require.Eventually(t, func() bool {
				return get(t, key(name), &cluster) && ptr.Deref(cluster.Status.Initialization.InfrastructureProvisioned, false) &&
					ptr.Deref(cluster.Status.Initialization.ControlPlaneInitialized, false) &&
					conditions.IsTrue(&cluster, clusterv1.AvailableCondition)
			}, waitLong, tick, "Cluster %s becomes Available", name)
			require.Equal(t, u.Hostname(), cluster.Spec.ControlPlaneEndpoint.Host)
			var nc infrav1.NstanceCluster
			require.True(t, get(t, key(name), &nc))
			require.Equal(t, []infrav1.FailureDomain{{Name: shardID, ControlPlane: ptr.To(false)}}, nc.Status.FailureDomains)
		}

		// Default flavour: the MachinePool reaches two Ready replicas.
		var pool clusterv1.MachinePool
		require.Eventually(t, func() bool {
			return get(t, key(clusterID+"-workers"), &pool) && ptr.Deref(pool.Status.Replicas, 0) == 2 &&
				ptr.Deref(pool.Status.ReadyReplicas, 0) == 2 && len(pool.Status.NodeRefs) == 2 &&
				pool.Status.Phase == string(clusterv1.MachinePoolPhaseRunning)
		}, waitLong, tick, "MachinePool %s runs 2 ready replicas: %+v", clusterID+"-workers", pool.Status)
		var nmp infrav1.NstanceMachinePool
		require.True(t, get(t, key(clusterID+"-workers"), &nmp))
		require.Equal(t, "workers", nmp.Spec.Group)
		require.Len(t, nmp.Spec.ProviderIDList, 2)

		// MachineDeployment flavour: two Machines Ready and Available, each
		// an instance of group md-0 in the shard of its failure domain.
		var dep clusterv1.MachineDeployment
		require.Eventually(t, func() bool {
			return get(t, key(mdCluster+"-md-0"), &dep) && ptr.Deref(dep.Status.ReadyReplicas, 0) == 2 &&
				ptr.Deref(dep.Status.AvailableReplicas, 0) == 2 && conditions.IsTrue(&dep, clusterv1.MachineDeploymentAvailableCondition)
		}, waitLong, tick, "MachineDeployment has 2 available replicas: %+v", dep.Status)
		var machines clusterv1.MachineList
		require.NoError(t, env.Client.List(ctx, &machines, client.InNamespace(f.ns),
			client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: mdCluster + "-md-0"}))
		require.Len(t, machines.Items, 2)
		for i := range machines.Items {
			m := &machines.Items[i]
			require.True(t, conditions.IsTrue(m, clusterv1.MachineReadyCondition), "%s: %+v", m.Name, m.Status.Conditions)
			require.True(t, conditions.IsTrue(m, clusterv1.MachineNodeHealthyCondition), m.Name)
			require.Equal(t, shardID, m.Spec.FailureDomain)
			var nm infrav1.NstanceMachine
			require.True(t, get(t, key(m.Spec.InfrastructureRef.Name), &nm))
			require.Equal(t, "md-0", nm.Spec.Group)
			require.Equal(t, shardID, nm.Status.Shard)
			require.Equal(t, nm.Spec.ProviderID, m.Spec.ProviderID)
			require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_RUNNING, instanceState(t, f.shard, nm.Status.InstanceID))
		}
		var cluster clusterv1.Cluster
		require.Eventually(t, func() bool {
			return get(t, key(mdCluster), &cluster) && ptr.Deref(cluster.Status.Workers.ReadyReplicas, 0) == 2 &&
				conditions.IsTrue(&cluster, clusterv1.ClusterWorkersAvailableCondition) &&
				conditions.IsTrue(&cluster, clusterv1.AvailableCondition)
		}, waitLong, tick, "Cluster %s counts its two ready workers and stays Available", mdCluster)
	})
}
