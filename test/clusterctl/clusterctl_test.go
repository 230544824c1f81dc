package clusterctl_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"debug/buildinfo"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	addonsv1beta1 "sigs.k8s.io/cluster-api/api/addons/v1beta1" //nolint:staticcheck // CAPI's webhooks convert from v1beta1
	addonsv1 "sigs.k8s.io/cluster-api/api/addons/v1beta2"
	clusterv1beta1 "sigs.k8s.io/cluster-api/api/core/v1beta1" //nolint:staticcheck // CAPI's webhooks convert from v1beta1
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ipamv1alpha1 "sigs.k8s.io/cluster-api/api/ipam/v1alpha1" //nolint:staticcheck // CAPI's webhooks convert from v1alpha1
	ipamv1beta1 "sigs.k8s.io/cluster-api/api/ipam/v1beta1"   //nolint:staticcheck // CAPI's webhooks convert from v1beta1
	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
	runtimev1alpha1 "sigs.k8s.io/cluster-api/api/runtime/v1alpha1" //nolint:staticcheck // CAPI's webhooks convert from v1alpha1
	runtimev1 "sigs.k8s.io/cluster-api/api/runtime/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	capicluster "sigs.k8s.io/cluster-api/core/reconcilers/cluster"
	capimachine "sigs.k8s.io/cluster-api/core/reconcilers/machine"
	capimachinepool "sigs.k8s.io/cluster-api/core/reconcilers/machinepool"
	"sigs.k8s.io/cluster-api/core/setup"
	coreadmission "sigs.k8s.io/cluster-api/core/webhooks/admission"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/index"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/yaml"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/nonce"
	opconfig "github.com/nstance-dev/nstance/internal/operator/config"
	"github.com/nstance-dev/nstance/internal/operator/manager"
	opwebhook "github.com/nstance-dev/nstance/internal/operator/webhook"
	"github.com/nstance-dev/nstance/internal/pki"
	"github.com/nstance-dev/nstance/internal/server/grpcserve"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/registration"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

// The names README.md's clusterctl flow uses.
const (
	clusterID = "prod"
	shardID   = "us-west-2a"
	namespace = "nstance-system"
	tenant    = "default"
	workers   = 2
	waitLong  = 2 * time.Minute
	tick      = 100 * time.Millisecond
)

// TestClusterctlInstall installs core Cluster API and the Nstance provider
// with `clusterctl init --infrastructure nstance` from a local repository
// into a bare API server, creates a cluster with `clusterctl generate
// cluster | kubectl apply -f -`, and waits for the in-process controllers to
// take it to Available with its workers Ready (see the package doc for what
// is real and what is not).
func TestClusterctlInstall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an API server and runs clusterctl, core Cluster API and the operator")
	}
	ctrllog.SetLogger(logr.Discard())
	ctx := t.Context()
	root, err := kubetest.RepoRoot()
	require.NoError(t, err)
	capiDir, capiVersion := capiModule(t, root)
	cctl := clusterctlBinary(t, root, capiVersion)
	helm := tool(t, root, "helm")
	version := releaseVersion(t, root)

	env, stop, err := kubetest.StartEnvWith(kubetest.Options{NoCRDs: true})
	require.NoError(t, err, "start a bare API server")
	t.Cleanup(func() { require.NoError(t, stop()) })
	work := t.TempDir()
	kubectl := func(args ...string) string {
		t.Helper()
		cmd := env.Kubectl(ctx, args...)
		cmd.Dir = work
		return run(t, cmd)
	}
	kubectl("apply", "-f", filepath.Join(root, "test", "clusterctl", "testdata", "cert-manager-api.yaml"))
	kubectl("wait", "--for=condition=Established", "--timeout=60s",
		"crd/issuers.cert-manager.io", "crd/certificates.cert-manager.io")

	// The shard and its registration server; the CA and a one-time nonce
	// are what a user gets from nstance-admin.
	sh, regAddr, caPEM, nonceJWT := startShard(t, env.Client)
	require.NoError(t, os.WriteFile(filepath.Join(work, "ca.crt"), caPEM, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(work, "nonce.jwt"), []byte(nonceJWT), 0o600))

	// README: the two objects, then clusterctl init with the operator's
	// settings.
	kubectl("create", "namespace", namespace)
	kubectl("-n", namespace, "create", "configmap", "nstance-cluster-ca", "--from-file=ca.crt")
	kubectl("-n", namespace, "create", "secret", "generic", "nstance-operator-nonce", "--from-file=nonce.jwt")
	home := filepath.Join(work, "home")
	repo := providerRepository(t, root, capiDir, capiVersion, helm, env.AssetsDir, version, filepath.Join(work, "repository"))
	require.NoError(t, os.MkdirAll(filepath.Join(home, ".cluster-api"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(home, ".cluster-api", "clusterctl.yaml"), repo, 0o600))
	endpoints := fmt.Sprintf(`{"%s":{"registration_addr":"%s","operator_addr":"%s"}}`, shardID, regAddr, sh.OperatorAddr)
	cenv := []string{
		"HOME=" + home, "PATH=" + os.Getenv("PATH"), "KUBECONFIG=" + env.Kubeconfig,
		"CLUSTERCTL_DISABLE_VERSIONCHECK=true",
		"NSTANCE_CLUSTER_ID=" + clusterID, "NSTANCE_SHARD_ENDPOINTS=" + endpoints,
	}
	initCmd := exec.CommandContext(ctx, cctl, "init", "--infrastructure", "nstance")
	initCmd.Env, initCmd.Dir = cenv, work
	out := runCombined(t, initCmd)
	t.Logf("clusterctl init:\n%s", out)

	t.Run("clusterctl installed the four providers at the repository's versions", func(t *testing.T) {
		var list unstructured.UnstructuredList
		list.SetGroupVersionKind(schema.GroupVersionKind{Group: "clusterctl.cluster.x-k8s.io", Version: "v1alpha3", Kind: "ProviderList"})
		require.NoError(t, env.Client.List(ctx, &list))
		var got []string
		for _, p := range list.Items {
			v, _, _ := unstructured.NestedString(p.Object, "version")
			got = append(got, p.GetNamespace()+"/"+p.GetName()+"@"+v)
		}
		slices.Sort(got)
		require.Equal(t, []string{
			"capi-kubeadm-bootstrap-system/bootstrap-kubeadm@" + capiVersion,
			"capi-kubeadm-control-plane-system/control-plane-kubeadm@" + capiVersion,
			"capi-system/cluster-api@" + capiVersion,
			namespace + "/infrastructure-nstance@" + version,
		}, got)
		// cert-manager was found, not installed.
		require.Contains(t, out, "Skipping installing cert-manager as it is already installed")
	})

	// The operator's settings are what clusterctl substituted into the
	// components.
	var cm corev1.ConfigMap
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "nstance-operator-config"}, &cm))
	cfg, err := opconfig.Parse([]byte(cm.Data["config.yaml"]))
	require.NoError(t, err, "the installed operator config:\n%s", cm.Data["config.yaml"])
	require.Equal(t, clusterID, cfg.ClusterID)
	require.Equal(t, map[string]opconfig.Shard{shardID: {RegistrationAddr: regAddr, OperatorAddr: sh.OperatorAddr}}, cfg.Shards)
	opEnv := deploymentEnv(t, env.Client)

	// The installed admission webhooks, served in-process.
	capiHooks := repointWebhooks(t, env.Client, "cluster-api")
	opHooks := repointWebhooks(t, env.Client, "infrastructure-nstance")
	startCAPI(t, env, capiHooks)
	startOperator(t, manager.Options{
		Config: cfg, Env: opEnv,
		RestConfig:      asServiceAccount(env.Config, namespace, "nstance-operator"),
		MetricsRegistry: prometheus.NewRegistry(), Log: logr.Discard(),
		MaxBackoff: 300 * time.Millisecond, RetryDelay: 300 * time.Millisecond, ImportWait: 5 * time.Second,
		SkipNameValidation: true,
		WebhookHost:        opHooks.LocalServingHost, WebhookPort: opHooks.LocalServingPort, WebhookCertDir: opHooks.LocalServingCertDir,
		DrainRetryInterval: 100 * time.Millisecond, MachinePollInterval: 100 * time.Millisecond,
	})
	for _, hooks := range []*envtest.WebhookInstallOptions{capiHooks, opHooks} {
		installWebhooks(t, env.Client, hooks)
	}

	// README: generate the cluster named after the cluster ID and apply it.
	u, err := url.Parse(env.Config.Host)
	require.NoError(t, err)
	gen := exec.CommandContext(ctx, "bash", "-o", "pipefail", "-c",
		`"$CLUSTERCTL" generate cluster `+clusterID+` --infrastructure nstance --target-namespace `+namespace+
			` | "$KUBECTL" apply -f -`)
	gen.Env = append(slices.Clone(cenv), "CLUSTERCTL="+cctl, "KUBECTL="+filepath.Join(env.AssetsDir, "kubectl"),
		"NSTANCE_SHARDS="+shardID, "NSTANCE_CONTROL_PLANE_HOST="+u.Hostname(), "NSTANCE_CONTROL_PLANE_PORT="+u.Port(),
		fmt.Sprintf("WORKER_MACHINE_COUNT=%d", workers))
	gen.Dir = work
	t.Logf("clusterctl generate cluster | kubectl apply:\n%s", run(t, gen))

	key := func(name string) client.ObjectKey { return client.ObjectKey{Namespace: namespace, Name: name} }
	var cluster clusterv1.Cluster
	waitFor(t, "Cluster "+clusterID+" becomes Available", func() bool {
		return get(t, env.Client, key(clusterID), &cluster) &&
			ptr.Deref(cluster.Status.Initialization.InfrastructureProvisioned, false) &&
			ptr.Deref(cluster.Status.Initialization.ControlPlaneInitialized, false) &&
			conditions.IsTrue(&cluster, clusterv1.AvailableCondition)
	}, func() string { return conditionsOf(&cluster) })
	// The README's checks say the same: the Cluster is Available and the
	// operator registered with the shard as its ServiceAccount (it stored
	// its certificate).
	kubectl("-n", namespace, "wait", "--for=condition=Available", "cluster/"+clusterID, "--timeout=60s")
	kubectl("-n", namespace, "get", "secret", "nstance-operator-cert")
	for _, c := range []string{clusterv1.ClusterInfrastructureReadyCondition, clusterv1.ClusterControlPlaneAvailableCondition,
		clusterv1.ClusterRemoteConnectionProbeCondition} {
		require.True(t, conditions.IsTrue(&cluster, c), "%s: %s", c, conditionsOf(&cluster))
	}
	var pool clusterv1.MachinePool
	waitFor(t, fmt.Sprintf("MachinePool %s-workers runs %d ready replicas", clusterID, workers), func() bool {
		return get(t, env.Client, key(clusterID+"-workers"), &pool) && ptr.Deref(pool.Status.ReadyReplicas, 0) == workers &&
			len(pool.Status.NodeRefs) == workers && pool.Status.Phase == string(clusterv1.MachinePoolPhaseRunning)
	}, func() string { return fmt.Sprintf("%+v", pool.Status) })
	waitFor(t, "Cluster "+clusterID+" counts its ready workers and stays Available", func() bool {
		return get(t, env.Client, key(clusterID), &cluster) && ptr.Deref(cluster.Status.Workers.ReadyReplicas, 0) == workers &&
			conditions.IsTrue(&cluster, clusterv1.ClusterWorkersAvailableCondition) &&
			conditions.IsTrue(&cluster, clusterv1.AvailableCondition)
	}, func() string { return conditionsOf(&cluster) })

	t.Run("the installed webhook configurations reach both webhook servers", func(t *testing.T) {
		// Core CAPI's: a MachinePool whose template names another Cluster
		// is refused by its validating webhook.
		// Merge patches carry no resourceVersion: the controllers' own
		// writes meanwhile do not turn the refusal into a conflict.
		bad := pool.DeepCopy()
		bad.Spec.Template.Spec.ClusterName = "other"
		err := env.Client.Patch(ctx, bad, client.MergeFrom(&pool), client.DryRunAll)
		require.Error(t, err)
		require.Contains(t, err.Error(), `admission webhook "validation.machinepool.cluster.x-k8s.io" denied the request`)
		// The operator's: the template of a static pool is immutable.
		static := &infrav1.NstanceMachinePool{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "static-probe",
				Annotations: map[string]string{opwebhook.StaticAnnotation: "true"}},
			Spec: infrav1.NstanceMachinePoolSpec{Group: "static-probe", Shards: []string{shardID}, Template: "worker"},
		}
		require.NoError(t, env.Client.Create(ctx, static))
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), static) })
		changed := static.DeepCopy()
		changed.Spec.Template = "other"
		err = env.Client.Patch(ctx, changed, client.MergeFrom(static), client.DryRunAll)
		require.Error(t, err)
		require.Contains(t, err.Error(), `admission webhook "validation.nstancemachinepool.infrastructure.cluster.x-k8s.io" denied the request`)
		require.Contains(t, err.Error(), "immutable on a static pool")
	})
}

// waitFor polls cond until it holds, failing the test after waitLong with
// what and detail() (the state last seen).
func waitFor(t *testing.T, what string, cond func() bool, detail func() string) {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s; last seen: %s", what, waitLong, detail())
		}
		time.Sleep(tick)
	}
}

// capiModule is the directory and version of sigs.k8s.io/cluster-api in
// go.mod.
func capiModule(t *testing.T, root string) (dir, version string) {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}} {{.Version}}", "sigs.k8s.io/cluster-api")
	cmd.Dir = root
	f := strings.Fields(run(t, cmd))
	require.Len(t, f, 2)
	return f[0], f[1]
}

// tool returns bin/<name>, made by the Makefile's rule when missing.
func tool(t *testing.T, root, name string) string {
	t.Helper()
	bin := filepath.Join(root, "bin", name)
	if _, err := os.Stat(bin); err != nil {
		cmd := exec.Command("make", "--no-print-directory", "bin/"+name)
		cmd.Dir = root
		run(t, cmd)
	}
	return bin
}

// clusterctlBinary returns bin/clusterctl and checks it was built from the
// cluster-api version of go.mod.
func clusterctlBinary(t *testing.T, root, want string) string {
	t.Helper()
	bin := tool(t, root, "clusterctl")
	info, err := buildinfo.ReadFile(bin)
	require.NoError(t, err)
	var built string
	for _, d := range append([]*debug.Module{&info.Main}, info.Deps...) {
		if d.Path == "sigs.k8s.io/cluster-api" {
			built = d.Version
		}
	}
	require.Equal(t, want, built, "bin/clusterctl is not built from go.mod's cluster-api: run make -B bin/clusterctl")
	return bin
}

// releaseVersion is the first patch release of the newest release series
// metadata.yaml declares: the versions clusterctl accepts for the provider.
func releaseVersion(t *testing.T, root string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "metadata.yaml"))
	require.NoError(t, err)
	var md struct {
		ReleaseSeries []struct{ Major, Minor int } `json:"releaseSeries"`
	}
	require.NoError(t, yaml.Unmarshal(data, &md))
	require.NotEmpty(t, md.ReleaseSeries)
	last := md.ReleaseSeries[len(md.ReleaseSeries)-1]
	return fmt.Sprintf("v%d.%d.0", last.Major, last.Minor)
}

// providerRepository fills dir as a local clusterctl repository and returns
// the clusterctl.yaml naming it: core Cluster API and the kubeadm providers
// (which clusterctl init adds on a first run) kustomized from the module
// cache, and the Nstance provider written by scripts/release.sh.
func providerRepository(t *testing.T, root, capiDir, capiVersion, helm, assets, version, dir string) []byte {
	t.Helper()
	metadata, err := os.ReadFile(filepath.Join(capiDir, "metadata.yaml"))
	require.NoError(t, err)
	var conf strings.Builder
	conf.WriteString("providers:\n")
	for _, p := range []struct{ name, typ, label, config, file string }{
		{"cluster-api", "CoreProvider", "cluster-api", "core", "core-components.yaml"},
		{"kubeadm", "BootstrapProvider", "bootstrap-kubeadm", "bootstrap/kubeadm", "bootstrap-components.yaml"},
		{"kubeadm", "ControlPlaneProvider", "control-plane-kubeadm", "controlplane/kubeadm", "control-plane-components.yaml"},
	} {
		vdir := filepath.Join(dir, p.label, capiVersion)
		require.NoError(t, os.MkdirAll(vdir, 0o755))
		cmd := exec.Command(filepath.Join(assets, "kubectl"), "kustomize", filepath.Join(capiDir, filepath.FromSlash(p.config), "config", "default"))
		require.NoError(t, os.WriteFile(filepath.Join(vdir, p.file), []byte(run(t, cmd)), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(vdir, "metadata.yaml"), metadata, 0o644))
		fmt.Fprintf(&conf, "  - name: %s\n    type: %s\n    url: file://%s\n", p.name, p.typ, filepath.Join(vdir, p.file))
	}
	cmd := exec.Command(filepath.Join(root, "scripts", "release.sh"), "--provider-repository")
	cmd.Env = append(os.Environ(), "VERSION="+version, "HELM="+helm, "DIST="+dir+"/dist")
	run(t, cmd)
	// The layout clusterctl wants is {base}/{provider label}/{version}/, as
	// release.sh writes it under dist/<version>/.
	components := filepath.Join(dir, "dist", version, "infrastructure-nstance", version, "infrastructure-components.yaml")
	for _, f := range []string{"infrastructure-components.yaml", "metadata.yaml", "cluster-template.yaml"} {
		_, err := os.Stat(filepath.Join(filepath.Dir(components), f))
		require.NoError(t, err, "release.sh --provider-repository writes %s", f)
	}
	fmt.Fprintf(&conf, "  - name: nstance\n    type: InfrastructureProvider\n    url: file://%s\n", components)
	return []byte(conf.String())
}

// deploymentEnv is the operator's environment as the installed Deployment
// sets it.
func deploymentEnv(t *testing.T, c client.Client) opconfig.Env {
	t.Helper()
	var dep appsv1.Deployment
	require.NoError(t, c.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: "nstance-operator"}, &dep))
	vars := map[string]string{}
	for _, ctr := range dep.Spec.Template.Spec.Containers {
		if ctr.Name != "manager" {
			continue
		}
		for _, e := range ctr.Env {
			switch {
			case e.ValueFrom == nil:
				vars[e.Name] = e.Value
			case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
				vars[e.Name] = dep.Namespace
			}
		}
	}
	require.NotEmpty(t, vars, "the manager container's environment")
	e, err := opconfig.ParseEnv(func(k string) string { return vars[k] }, func() (string, error) { return dep.Namespace, nil })
	require.NoError(t, err)
	return e
}

// asServiceAccount is cfg impersonating a ServiceAccount, as its pod's
// token would authenticate it.
func asServiceAccount(cfg *rest.Config, ns, name string) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + ns + ":" + name,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
	}
	return c
}

// repointWebhooks reads the admission webhook configurations clusterctl
// installed for provider (its cluster.x-k8s.io/provider label) and prepares
// a local serving address and certificate for them, with every clientConfig
// rewritten to that address and CA (installWebhooks stores them).
func repointWebhooks(t *testing.T, c client.Client, provider string) *envtest.WebhookInstallOptions {
	t.Helper()
	ctx := context.Background()
	sel := client.MatchingLabels{clusterv1.ProviderNameLabel: provider}
	var vs admissionv1.ValidatingWebhookConfigurationList
	require.NoError(t, c.List(ctx, &vs, sel))
	var ms admissionv1.MutatingWebhookConfigurationList
	require.NoError(t, c.List(ctx, &ms, sel))
	wo := &envtest.WebhookInstallOptions{}
	for i := range vs.Items {
		wo.ValidatingWebhooks = append(wo.ValidatingWebhooks, &vs.Items[i])
	}
	for i := range ms.Items {
		wo.MutatingWebhooks = append(wo.MutatingWebhooks, &ms.Items[i])
	}
	require.NotEmpty(t, wo.ValidatingWebhooks, "%s installed a validating webhook configuration", provider)
	require.NoError(t, wo.PrepWithoutInstalling())
	t.Cleanup(func() { _ = wo.Cleanup() })
	return wo
}

// installWebhooks stores the rewritten configurations of wo.
func installWebhooks(t *testing.T, c client.Client, wo *envtest.WebhookInstallOptions) {
	t.Helper()
	for _, v := range wo.ValidatingWebhooks {
		require.NoError(t, c.Update(context.Background(), v), "point %s at the local server", v.Name)
	}
	for _, m := range wo.MutatingWebhooks {
		require.NoError(t, c.Update(context.Background(), m), "point %s at the local server", m.Name)
	}
}

// startCAPI runs core Cluster API's Cluster, Machine and MachinePool
// controllers, its ClusterCache and its admission webhooks (on the server
// hooks prepared) as its manager wires them, until the test ends.
func startCAPI(t *testing.T, env *kubetest.Env, hooks *envtest.WebhookInstallOptions) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	scheme, err := kubetest.NewScheme()
	require.NoError(t, err)
	for _, add := range []func(*k8sruntime.Scheme) error{
		// Every kind of core CAPI's webhooks, in every version they convert.
		clusterv1beta1.AddToScheme, addonsv1beta1.AddToScheme, addonsv1.AddToScheme, ipamv1alpha1.AddToScheme,
		ipamv1beta1.AddToScheme, ipamv1.AddToScheme, runtimev1alpha1.AddToScheme, runtimev1.AddToScheme,
	} {
		require.NoError(t, add(scheme))
	}
	// The name must be unique per process: CAPI registers informer names
	// globally and panics on a repeat (go test -count=2).
	name := fmt.Sprintf("capi-clusterctl-%d", time.Now().UnixNano())
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 scheme,
		Logger:                 logr.Discard(),
		Cache:                  setup.ManagerCacheOptions(scheme, name, "", 10*time.Minute),
		Client:                 setup.ManagerClientOptions(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: hooks.LocalServingHost, Port: hooks.LocalServingPort, CertDir: hooks.LocalServingCertDir,
		}),
	})
	require.NoError(t, err)
	require.NoError(t, index.AddDefaultIndexes(ctx, mgr))
	secretClient, err := setup.CreateSecretCachingClient(mgr)
	require.NoError(t, err)
	opts := controller.Options{MaxConcurrentReconciles: 2, SkipNameValidation: ptr.To(true)}
	cc, err := clustercache.SetupWithManager(ctx, mgr, clustercache.Options{
		SecretClient: secretClient,
		Cache:        setup.ClusterCacheCacheOptions(),
		Client:       setup.ClusterCacheClientOptions(name, 20, 30),
	}, opts)
	require.NoError(t, err)
	retry, ok := cc.(interface{ SetConnectionCreationRetryInterval(time.Duration) })
	require.True(t, ok)
	retry.SetConnectionCreationRetryInterval(time.Second)
	for _, s := range []func(ctrl.Manager) error{
		(&coreadmission.ClusterClass{Client: mgr.GetClient()}).SetupWebhookWithManager,
		(&coreadmission.Cluster{Client: mgr.GetClient(), ClusterCacheReader: cc}).SetupWebhookWithManager,
		(&coreadmission.Machine{}).SetupWebhookWithManager,
		(&coreadmission.MachineSet{}).SetupWebhookWithManager,
		(&coreadmission.MachineDeployment{}).SetupWebhookWithManager,
		(&coreadmission.MachineDrainRule{}).SetupWebhookWithManager,
		(&coreadmission.MachinePool{}).SetupWebhookWithManager,
		(&coreadmission.ClusterResourceSet{}).SetupWebhookWithManager,
		(&coreadmission.ClusterResourceSetBinding{}).SetupWebhookWithManager,
		(&coreadmission.MachineHealthCheck{}).SetupWebhookWithManager,
		(&coreadmission.ExtensionConfig{}).SetupWebhookWithManager,
		(&coreadmission.IPAddress{Client: mgr.GetAPIReader()}).SetupWebhookWithManager,
		(&coreadmission.IPAddressClaim{}).SetupWebhookWithManager,
	} {
		require.NoError(t, s(mgr))
	}
	require.NoError(t, (&capicluster.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: cc,
		RemoteConnectionGracePeriod: 50 * time.Second}).SetupWithManager(ctx, mgr, opts))
	require.NoError(t, (&capimachine.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: cc,
		RemoteConditionsGracePeriod: 5 * time.Minute}).SetupWithManager(ctx, mgr, opts))
	require.NoError(t, (&capimachinepool.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: cc}).
		SetupWithManager(ctx, mgr, opts))
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if s, ok := cc.(interface{ Shutdown() }); ok {
			s.Shutdown()
		}
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Error("core Cluster API's manager did not stop")
		}
	})
	require.Eventually(t, func() bool { return mgr.GetWebhookServer().StartedChecker()(nil) == nil },
		waitLong, tick, "core Cluster API's webhook server serving")
}

// startOperator runs the operator until the test ends and waits for its
// webhook server.
func startOperator(t *testing.T, o manager.Options) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	op, err := manager.New(ctx, o)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- op.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("operator did not stop")
		}
	})
	require.Eventually(t, func() bool {
		select {
		case err := <-done:
			t.Fatalf("operator stopped: %v", err)
		default:
		}
		return op.Manager.GetWebhookServer().StartedChecker()(nil) == nil
	}, waitLong, tick, "operator's webhook server serving")
}

// nodeProvider is the mock provider that also registers a Node for every
// instance it creates, with the instance's provider ID and a kubelet's
// healthy conditions, as the dev stack's providers write fake Nodes.
type nodeProvider struct {
	*mock.Provider
	c client.Client
}

func (p *nodeProvider) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	inst, err := p.Provider.Create(ctx, req)
	if err != nil {
		return inst, err
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: inst.InstanceID}, Spec: corev1.NodeSpec{ProviderID: inst.ProviderID}}
	if err := p.c.Create(ctx, node); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return inst, nil
		}
		return inst, fmt.Errorf("create Node %s: %w", node.Name, err)
	}
	now := metav1.Now()
	node.Status.Conditions = []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now},
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", LastHeartbeatTime: now, LastTransitionTime: now},
		{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", LastHeartbeatTime: now, LastTransitionTime: now},
		{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientPID", LastHeartbeatTime: now, LastTransitionTime: now},
	}
	if err := p.c.Status().Update(ctx, node); err != nil {
		return inst, fmt.Errorf("mark Node %s ready: %w", node.Name, err)
	}
	return inst, nil
}

// startShard starts one shard and a registration server of a new cluster CA
// and returns the shard, the registration address, the CA certificate and
// an operator nonce.
func startShard(t *testing.T, nodes client.Client) (sh *shardtest.Shard, regAddr string, caPEM []byte, nonceJWT string) {
	t.Helper()
	ca, err := pki.GenerateCA(clusterID, 24*time.Hour, time.Now())
	require.NoError(t, err)
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	cert, err := ca.ServerKeyPair(pki.ServerIdentity{Shard: shardID, ServerID: "nstance-server"}, []string{"127.0.0.1"}, time.Hour, time.Now())
	require.NoError(t, err)
	reg := registration.New(registration.Options{ClusterID: clusterID, ServerID: "reg", NonceKey: pub,
		Issuer: &registration.Issuer{CA: ca, ClusterID: clusterID, AgentValidity: time.Hour, OperatorValidity: time.Hour},
		Store:  memstore.New(), Keys: layout.New(""), Log: logr.Discard()})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := grpcserve.Start(grpcserve.Config{ClusterID: clusterID, ServerCert: cert, ClientCAs: ca.Pool(), Registration: reg},
		grpcserve.Listeners{Registration: ln})
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	sh = shardtest.Start(t, shardtest.Options{ClusterID: clusterID, ShardID: shardID, CA: ca,
		Provider: &nodeProvider{Provider: mock.New(), c: nodes}, Log: logr.Discard()})
	tok, err := nonce.Mint(priv, nonce.Claims{Kind: nonce.KindOperator, ClusterID: clusterID, Tenant: tenant,
		RegisteredClaims: jwt.RegisteredClaims{Subject: "operator"}}, time.Hour, time.Now())
	require.NoError(t, err)
	return sh, ln.Addr().String(), ca.CertPEM, tok
}

func get(t *testing.T, c client.Client, key client.ObjectKey, obj client.Object) bool {
	t.Helper()
	err := c.Get(context.Background(), key, obj)
	if apierrors.IsNotFound(err) {
		return false
	}
	require.NoError(t, err)
	return true
}

// conditionsOf lists an object's v1beta2 conditions, for failure messages.
func conditionsOf(c *clusterv1.Cluster) string {
	var b strings.Builder
	for _, cond := range c.Status.Conditions {
		fmt.Fprintf(&b, "\n  %s=%s %s: %s", cond.Type, cond.Status, cond.Reason, cond.Message)
	}
	return b.String()
}

// runCombined runs cmd and returns its stdout and stderr together (clusterctl
// logs to stderr), failing the test with them.
func runCombined(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s:\n%s", strings.Join(cmd.Args, " "), out)
	return string(out)
}

// run runs cmd and returns its stdout, failing the test with its output.
func run(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	require.NoError(t, err, "%s:\nstdout:\n%s\nstderr:\n%s", strings.Join(cmd.Args, " "), stdout.String(), stderr.String())
	return stdout.String()
}
