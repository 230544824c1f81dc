package controlplane_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cpv1 "github.com/nstance-dev/nstance/api/controlplane/v1beta1"
	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/cluster"
	"github.com/nstance-dev/nstance/internal/operator/controlplane"
)

func namespace(t *testing.T) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "cp-"}}
	require.NoError(t, env.Client.Create(t.Context(), ns))
	return ns.Name
}

// settle runs four passes: adding the finalizer and changing the Paused
// condition each end a pass early (as in CAPI's providers), and a settled
// object makes further passes no-ops. It returns the last result.
func settle(t *testing.T, r *controlplane.Reconciler, key client.ObjectKey) ctrl.Result {
	t.Helper()
	var res ctrl.Result
	for range 4 {
		var err error
		res, err = r.Reconcile(t.Context(), ctrl.Request{NamespacedName: key})
		require.NoError(t, err)
	}
	return res
}

func getCP(t *testing.T, key client.ObjectKey) *cpv1.NstanceControlPlane {
	t.Helper()
	cp := &cpv1.NstanceControlPlane{}
	require.NoError(t, env.Client.Get(t.Context(), key, cp))
	return cp
}

func kubeconfigToken(t *testing.T, key client.ObjectKey) (token, expires string, s corev1.Secret) {
	t.Helper()
	require.NoError(t, env.Client.Get(t.Context(), key, &s))
	cfg, err := clientcmd.Load(s.Data["value"])
	require.NoError(t, err)
	return cfg.AuthInfos[cfg.Contexts[cfg.CurrentContext].AuthInfo].Token, s.Annotations[controlplane.TokenExpiryAnnotation], s
}

// TestManagedKubeconfig: the control plane writes the <cluster>-kubeconfig
// Secret as the contract asks, reports itself externally managed,
// initialized, Available and Ready, refreshes the token after two thirds of
// its life, and deletes the Secret when it is deleted.
func TestManagedKubeconfig(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	ep, err := cluster.Endpoint(env.Config.Host)
	require.NoError(t, err)
	require.NoError(t, cluster.EnsureObjects(ctx, env.Client, ns, "prod", ep))
	server, ca, err := controlplane.APIServerFrom(env.Config)
	require.NoError(t, err)
	now := time.Now()
	r := &controlplane.Reconciler{Client: env.Client, ManageKubeconfig: true, ServiceAccount: "nstance-capi-workload",
		APIServer: server, CAData: ca, TokenTTL: time.Hour, Now: func() time.Time { return now }}
	key := client.ObjectKey{Namespace: ns, Name: "prod"}

	res := settle(t, r, key)
	require.InDelta(t, (40 * time.Minute).Seconds(), res.RequeueAfter.Seconds(), 60, "refresh after two thirds of the token life")
	cp := getCP(t, key)
	require.Contains(t, cp.Finalizers, cpv1.ControlPlaneFinalizer)
	require.True(t, ptr.Deref(cp.Status.ExternalManagedControlPlane, false))
	require.True(t, ptr.Deref(cp.Status.Initialization.ControlPlaneInitialized, false))
	require.Equal(t, ep, cp.Spec.ControlPlaneEndpoint)
	require.True(t, conditions.IsTrue(cp, cpv1.AvailableCondition))
	require.True(t, conditions.IsTrue(cp, cpv1.ReadyCondition))
	require.True(t, conditions.IsFalse(cp, clusterv1.PausedCondition))
	require.Equal(t, cp.Generation, cp.Status.ObservedGeneration)

	secretKey := client.ObjectKey{Namespace: ns, Name: "prod-kubeconfig"}
	tok1, exp1, s := kubeconfigToken(t, secretKey)
	require.NotEmpty(t, tok1)
	require.NotEmpty(t, exp1)
	require.Equal(t, clusterv1.ClusterSecretType, s.Type)
	require.Equal(t, "prod", s.Labels[clusterv1.ClusterNameLabel])
	require.True(t, metav1.IsControlledBy(&s, cp), "the control plane owns the kubeconfig Secret")
	cfg, err := clientcmd.Load(s.Data["value"])
	require.NoError(t, err)
	require.Equal(t, server, cfg.Clusters[cfg.Contexts[cfg.CurrentContext].Cluster].Server)

	// Before the refresh point nothing changes.
	now = now.Add(30 * time.Minute)
	settle(t, r, key)
	tok2, _, _ := kubeconfigToken(t, secretKey)
	require.Equal(t, tok1, tok2)

	// Past it, a new token is requested well before the old one expires.
	now = now.Add(15 * time.Minute)
	settle(t, r, key)
	tok3, exp3, _ := kubeconfigToken(t, secretKey)
	require.NotEqual(t, tok1, tok3, "token re-requested")
	require.NotEmpty(t, exp3)

	// Paused: Paused condition, no refresh.
	cl := &clusterv1.Cluster{}
	require.NoError(t, env.Client.Get(ctx, key, cl))
	patch := client.MergeFrom(cl.DeepCopy())
	cl.Spec.Paused = ptr.To(true)
	require.NoError(t, env.Client.Patch(ctx, cl, patch))
	now = now.Add(time.Hour)
	settle(t, r, key)
	require.True(t, conditions.IsTrue(getCP(t, key), clusterv1.PausedCondition))
	tok4, _, _ := kubeconfigToken(t, secretKey)
	require.Equal(t, tok3, tok4, "no refresh while paused")
	patch = client.MergeFrom(cl.DeepCopy())
	cl.Spec.Paused = ptr.To(false)
	require.NoError(t, env.Client.Patch(ctx, cl, patch))
	settle(t, r, key)
	require.True(t, conditions.IsFalse(getCP(t, key), clusterv1.PausedCondition))
	tok5, _, _ := kubeconfigToken(t, secretKey)
	require.NotEqual(t, tok3, tok5, "refreshed once unpaused")

	// Deletion removes the Secret, then the finalizer.
	require.NoError(t, env.Client.Delete(ctx, getCP(t, key)))
	settle(t, r, key)
	err = env.Client.Get(ctx, key, &cpv1.NstanceControlPlane{})
	require.True(t, apierrors.IsNotFound(err), "finalizer released: %v", err)
	err = env.Client.Get(ctx, secretKey, &corev1.Secret{})
	require.True(t, apierrors.IsNotFound(err), "kubeconfig Secret deleted: %v", err)
}

// TestTakesOverLegacySecret: a kubeconfig Secret written by an operator
// before the NstanceControlPlane existed (controlled by the NstanceCluster)
// is taken over, not refused.
func TestTakesOverLegacySecret(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	require.NoError(t, cluster.EnsureObjects(ctx, env.Client, ns, "old", infrav1.APIEndpoint{Host: "10.0.0.1", Port: 6443}))
	nc := &infrav1.NstanceCluster{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "old"}, nc))
	legacy := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "old-kubeconfig",
			Labels: map[string]string{clusterv1.ClusterNameLabel: "old"},
			Annotations: map[string]string{
				controlplane.TokenExpiryAnnotation: time.Now().Add(20 * time.Hour).UTC().Format(time.RFC3339)},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: infrav1.GroupVersion.String(), Kind: "NstanceCluster",
				Name: nc.Name, UID: nc.UID, Controller: ptr.To(true)}}},
		Type: clusterv1.ClusterSecretType,
		Data: map[string][]byte{"value": []byte("legacy")},
	}
	require.NoError(t, env.Client.Create(ctx, legacy))
	server, ca, err := controlplane.APIServerFrom(env.Config)
	require.NoError(t, err)
	r := &controlplane.Reconciler{Client: env.Client, ManageKubeconfig: true, ServiceAccount: "nstance-capi-workload",
		APIServer: server, CAData: ca}
	key := client.ObjectKey{Namespace: ns, Name: "old"}
	settle(t, r, key)
	cp := getCP(t, key)
	require.True(t, conditions.IsTrue(cp, cpv1.ReadyCondition), "%+v", cp.Status.Conditions)
	tok, _, s := kubeconfigToken(t, client.ObjectKeyFromObject(legacy))
	require.NotEmpty(t, tok)
	require.True(t, metav1.IsControlledBy(&s, cp))
	require.Len(t, s.OwnerReferences, 1, "the NstanceCluster no longer controls it")
}

// TestExternalKubeconfig: with NSTANCE_CAPI_ENDPOINT set the Secret is the
// user's; the control plane waits for it, then reports initialized. A
// Cluster naming another control plane leaves it alone.
func TestExternalKubeconfig(t *testing.T) {
	ctx := t.Context()
	ns := namespace(t)
	require.NoError(t, cluster.EnsureObjects(ctx, env.Client, ns, "ext", infrav1.APIEndpoint{Host: "api.example", Port: 6443}))
	r := &controlplane.Reconciler{Client: env.Client, ManageKubeconfig: false, ServiceAccount: "sa"}
	key := client.ObjectKey{Namespace: ns, Name: "ext"}
	settle(t, r, key)
	cp := getCP(t, key)
	require.Nil(t, cp.Status.Initialization.ControlPlaneInitialized)
	require.True(t, conditions.IsFalse(cp, cpv1.AvailableCondition))
	require.Equal(t, cpv1.WaitingForKubeconfigReason, conditions.GetReason(cp, cpv1.AvailableCondition))
	err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "ext-kubeconfig"}, &corev1.Secret{})
	require.True(t, apierrors.IsNotFound(err), "no kubeconfig Secret written when NSTANCE_CAPI_ENDPOINT is set")

	user := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ext-kubeconfig", Labels: map[string]string{clusterv1.ClusterNameLabel: "ext"}},
		Type:       clusterv1.ClusterSecretType, Data: map[string][]byte{"value": []byte("apiVersion: v1\nkind: Config\n")},
	}
	require.NoError(t, env.Client.Create(ctx, user))
	settle(t, r, key)
	cp = getCP(t, key)
	require.True(t, ptr.Deref(cp.Status.Initialization.ControlPlaneInitialized, false))
	require.True(t, conditions.IsTrue(cp, cpv1.AvailableCondition))

	// Deleting the user's Secret: unavailable, still initialized.
	require.NoError(t, env.Client.Delete(ctx, user))
	settle(t, r, key)
	cp = getCP(t, key)
	require.True(t, ptr.Deref(cp.Status.Initialization.ControlPlaneInitialized, false), "initialized latches")
	require.True(t, conditions.IsFalse(cp, cpv1.AvailableCondition))

	// A control plane the Cluster does not reference manages nothing.
	other := &cpv1.NstanceControlPlane{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "spare",
		Labels: map[string]string{clusterv1.ClusterNameLabel: "ext"}}}
	require.NoError(t, env.Client.Create(ctx, other))
	r.ManageKubeconfig = true
	settle(t, r, client.ObjectKeyFromObject(other))
	got := getCP(t, client.ObjectKeyFromObject(other))
	require.Equal(t, cpv1.NotReferencedReason, conditions.GetReason(got, cpv1.ReadyCondition))
	err = env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "ext-kubeconfig"}, &corev1.Secret{})
	require.True(t, apierrors.IsNotFound(err), "an unreferenced control plane writes no Secret")
}
