package webhook_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	opwebhook "github.com/nstance-dev/nstance/internal/operator/webhook"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

// TestStaticPoolImmutableOverTLS runs the validator in a controller-runtime
// webhook server with a real serving certificate; the API server calls it
// over TLS through a ValidatingWebhookConfiguration like the chart's.
func TestStaticPoolImmutableOverTLS(t *testing.T) {
	ctrllog.SetLogger(logr.Discard())
	assets, err := kubetest.AssetsDir()
	require.NoError(t, err)
	crds, err := kubetest.CRDDirs()
	require.NoError(t, err)
	scheme, err := kubetest.NewScheme()
	require.NoError(t, err)
	vwc := &admissionv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "nstance-operator-validating"},
		Webhooks: []admissionv1.ValidatingWebhook{{
			Name: "validation.nstancemachinepool.infrastructure.cluster.x-k8s.io", AdmissionReviewVersions: []string{"v1"},
			SideEffects: ptr.To(admissionv1.SideEffectClassNone), FailurePolicy: ptr.To(admissionv1.Fail),
			ClientConfig: admissionv1.WebhookClientConfig{Service: &admissionv1.ServiceReference{Name: "svc", Namespace: "default", Path: ptr.To(opwebhook.Path)}},
			Rules: []admissionv1.RuleWithOperations{{Operations: []admissionv1.OperationType{admissionv1.Create, admissionv1.Update},
				Rule: admissionv1.Rule{APIGroups: []string{infrav1.GroupVersion.Group}, APIVersions: []string{"v1beta1"}, Resources: []string{"nstancemachinepools"}}}},
		}, {
			Name: "validation.machinepool.static.nstance.dev", AdmissionReviewVersions: []string{"v1"},
			SideEffects: ptr.To(admissionv1.SideEffectClassNone), FailurePolicy: ptr.To(admissionv1.Fail),
			ClientConfig:   admissionv1.WebhookClientConfig{Service: &admissionv1.ServiceReference{Name: "svc", Namespace: "default", Path: ptr.To(opwebhook.MachinePoolPath)}},
			ObjectSelector: &metav1.LabelSelector{MatchLabels: map[string]string{opwebhook.StaticLabel: "true"}},
			Rules: []admissionv1.RuleWithOperations{{Operations: []admissionv1.OperationType{admissionv1.Update},
				Rule: admissionv1.Rule{APIGroups: []string{clusterv1.GroupVersion.Group}, APIVersions: []string{"v1beta2"}, Resources: []string{"machinepools"}}}},
		}},
	}
	te := &envtest.Environment{BinaryAssetsDirectory: assets, CRDDirectoryPaths: crds, ErrorIfCRDPathMissing: true, Scheme: scheme,
		WebhookInstallOptions: envtest.WebhookInstallOptions{ValidatingWebhooks: []*admissionv1.ValidatingWebhookConfiguration{vwc}}}
	cfg, err := te.Start()
	require.NoError(t, err)
	t.Cleanup(func() { _ = te.Stop() })
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	require.NoError(t, err)

	wo := te.WebhookInstallOptions
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"},
		WebhookServer: webhook.NewServer(webhook.Options{Host: wo.LocalServingHost, Port: wo.LocalServingPort, CertDir: wo.LocalServingCertDir})})
	require.NoError(t, err)
	require.NoError(t, opwebhook.Setup(mgr))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "wh-"}}
	require.NoError(t, c.Create(ctx, ns))
	newPool := func(name string, static bool) *infrav1.NstanceMachinePool {
		p := &infrav1.NstanceMachinePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name},
			Spec: infrav1.NstanceMachinePoolSpec{Group: name, Shards: []string{"a", "b"}, Template: "worker", SubnetPool: "default"}}
		if static {
			p.Annotations = map[string]string{opwebhook.StaticAnnotation: "true"}
		}
		// The first create may race the webhook server's start.
		require.Eventually(t, func() bool { return c.Create(ctx, p) == nil }, 30*time.Second, 100*time.Millisecond)
		return p
	}

	tests := []struct {
		name    string
		static  bool
		change  func(*infrav1.NstanceMachinePool)
		wantErr string
	}{
		{"static: shard change rejected", true, func(p *infrav1.NstanceMachinePool) { p.Spec.Shards = []string{"a"} }, "spec.shards"},
		{"static: template change rejected", true, func(p *infrav1.NstanceMachinePool) { p.Spec.Template = "other" }, "spec.template"},
		{"static: subnet pool change rejected", true, func(p *infrav1.NstanceMachinePool) { p.Spec.SubnetPool = "other" }, "spec.subnetPool"},
		{"static: marker removal rejected", true, func(p *infrav1.NstanceMachinePool) { p.Annotations = nil }, opwebhook.StaticAnnotation},
		{"static: vars change allowed", true, func(p *infrav1.NstanceMachinePool) { p.Spec.Vars = map[string]string{"k": "v"} }, ""},
		{"dynamic: shard change allowed", false, func(p *infrav1.NstanceMachinePool) { p.Spec.Shards = []string{"a"} }, ""},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPool("pool-"+string(rune('a'+i)), tc.static)
			tc.change(p)
			err := c.Update(ctx, p)
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			require.True(t, apierrors.IsInvalid(err), "%v", err)
			require.Contains(t, err.Error(), tc.wantErr)
			require.Contains(t, err.Error(), "denied the request", "rejected by the webhook, not the schema")
		})
	}

	t.Run("static MachinePool: scaling rejected, other changes allowed", func(t *testing.T) {
		newMP := func(name string, static bool) *clusterv1.MachinePool {
			mp := &clusterv1.MachinePool{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: name},
				Spec: clusterv1.MachinePoolSpec{ClusterName: "c", Replicas: ptr.To[int32](2),
					Template: clusterv1.MachineTemplateSpec{Spec: clusterv1.MachineSpec{ClusterName: "c",
						Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr.To("")},
						InfrastructureRef: clusterv1.ContractVersionedObjectReference{
							APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceMachinePool", Name: name}}}},
			}
			if static {
				mp.Labels = map[string]string{opwebhook.StaticLabel: "true"}
			}
			require.NoError(t, c.Create(ctx, mp))
			return mp
		}
		mp := newMP("mp-static", true)
		mp.Spec.Replicas = ptr.To[int32](3)
		err := c.Update(ctx, mp)
		require.Error(t, err)
		require.True(t, apierrors.IsInvalid(err), "%v", err)
		require.Contains(t, err.Error(), "denied the request")
		require.Contains(t, err.Error(), "spec.replicas")
		require.Contains(t, err.Error(), "sized by the shard config files (2 instances)")

		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(mp), mp))
		mp.Labels = nil
		err = c.Update(ctx, mp)
		require.Error(t, err)
		require.Contains(t, err.Error(), opwebhook.StaticLabel, "the marker cannot be removed to scale")

		require.NoError(t, c.Get(ctx, client.ObjectKeyFromObject(mp), mp))
		mp.Spec.FailureDomains = []string{"a"}
		require.NoError(t, c.Update(ctx, mp), "a change other than the size is allowed")

		dyn := newMP("mp-dynamic", false)
		dyn.Spec.Replicas = ptr.To[int32](3)
		require.NoError(t, c.Update(ctx, dyn), "a MachinePool of a dynamic pool scales")
	})

	// --disable-webhooks: the chart then installs no
	// ValidatingWebhookConfiguration (internal/packaging checks that), and
	// the same change goes through.
	p := newPool("pool-off", true)
	require.NoError(t, c.Delete(ctx, vwc))
	p.Spec.Shards = []string{"b"}
	require.Eventually(t, func() bool { return c.Update(ctx, p) == nil }, 30*time.Second, 100*time.Millisecond)
}
