package clusterctl_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/clusterctl"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

func TestClusterAndKubeconfig(t *testing.T) {
	env := kubetest.Start(t)
	ctx := t.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "cc-"}}
	require.NoError(t, env.Client.Create(ctx, ns))

	ep, err := clusterctl.Endpoint(env.Config.Host)
	require.NoError(t, err)
	require.NoError(t, clusterctl.EnsureObjects(ctx, env.Client, ns.Name, "prod", ep))
	require.NoError(t, clusterctl.EnsureObjects(ctx, env.Client, ns.Name, "prod", ep), "idempotent")
	var cl clusterv1.Cluster
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: "prod"}, &cl))
	require.Equal(t, "NstanceCluster", cl.Spec.InfrastructureRef.Kind)

	server, ca, err := clusterctl.APIServerFrom(env.Config)
	require.NoError(t, err)
	now := time.Now()
	r := &clusterctl.Reconciler{
		Client: env.Client, Shards: []string{"us-west-2a", "us-east-1a"}, ManageKubeconfig: true,
		ServiceAccount: "nstance-capi-workload", APIServer: server, CAData: ca, TokenTTL: time.Hour,
		Now: func() time.Time { return now },
	}
	req := ctrl.Request{NamespacedName: client.ObjectKey{Namespace: ns.Name, Name: "prod"}}
	res, err := r.Reconcile(ctx, req)
	require.NoError(t, err)
	require.InDelta(t, (40 * time.Minute).Seconds(), res.RequeueAfter.Seconds(), 60, "refresh after two thirds of the token life")

	var nc infrav1.NstanceCluster
	require.NoError(t, env.Client.Get(ctx, req.NamespacedName, &nc))
	require.Equal(t, []string{"us-east-1a", "us-west-2a"}, []string{nc.Status.FailureDomains[0].Name, nc.Status.FailureDomains[1].Name})
	require.True(t, nc.Status.Ready)
	require.True(t, *nc.Status.Initialization.Provisioned)
	require.Equal(t, ep, nc.Spec.ControlPlaneEndpoint)

	secretKey := client.ObjectKey{Namespace: ns.Name, Name: "prod-kubeconfig"}
	token := func() (string, string) {
		var s corev1.Secret
		require.NoError(t, env.Client.Get(ctx, secretKey, &s))
		require.Equal(t, clusterv1.ClusterSecretType, s.Type)
		require.Equal(t, "prod", s.Labels[clusterv1.ClusterNameLabel])
		cfg, err := clientcmd.Load(s.Data["value"])
		require.NoError(t, err)
		require.Equal(t, server, cfg.Clusters[cfg.Contexts[cfg.CurrentContext].Cluster].Server)
		return cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo].Token, s.Annotations[clusterctl.TokenExpiryAnnotation]
	}
	tok1, exp1 := token()
	require.NotEmpty(t, exp1)
	require.NotEmpty(t, tok1)

	// Before the refresh point nothing changes.
	now = now.Add(30 * time.Minute)
	_, err = r.Reconcile(ctx, req)
	require.NoError(t, err)
	tok2, _ := token()
	require.Equal(t, tok1, tok2)

	// Past it, a new token is requested well before the old one expires.
	now = now.Add(15 * time.Minute)
	_, err = r.Reconcile(ctx, req)
	require.NoError(t, err)
	tok3, exp3 := token()
	require.NotEqual(t, tok1, tok3, "token re-requested")
	require.NotEmpty(t, exp3)
}

func TestKubeconfigSkippedWithExternalEndpoint(t *testing.T) {
	env := kubetest.Start(t)
	ctx := t.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "cc-"}}
	require.NoError(t, env.Client.Create(ctx, ns))
	require.NoError(t, clusterctl.EnsureObjects(ctx, env.Client, ns.Name, "ext", infrav1.APIEndpoint{Host: "api.example", Port: 6443}))
	r := &clusterctl.Reconciler{Client: env.Client, Shards: []string{"a"}, ManageKubeconfig: false, ServiceAccount: "sa"}
	_, err := r.Reconcile(ctx, ctrl.Request{NamespacedName: client.ObjectKey{Namespace: ns.Name, Name: "ext"}})
	require.NoError(t, err)
	var s corev1.Secret
	err = env.Client.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: "ext-kubeconfig"}, &s)
	require.Error(t, err, "no kubeconfig Secret when NSTANCE_CAPI_ENDPOINT is set")
}

func TestEndpoint(t *testing.T) {
	tests := []struct {
		in   string
		want infrav1.APIEndpoint
	}{
		{"https://10.0.0.1:6443", infrav1.APIEndpoint{Host: "10.0.0.1", Port: 6443}},
		{"https://api.example.com", infrav1.APIEndpoint{Host: "api.example.com", Port: 443}},
		{"api.example.com:8443", infrav1.APIEndpoint{Host: "api.example.com", Port: 8443}},
	}
	for _, tt := range tests {
		got, err := clusterctl.Endpoint(tt.in)
		require.NoError(t, err)
		require.Equal(t, tt.want, got, tt.in)
	}
}
