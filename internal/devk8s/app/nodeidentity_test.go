package app

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestNodeIdentity drives dev-k8s with a kubelet's client certificate
// through the requests a kubelet makes, and checks what it may not do.
func TestNodeIdentity(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	dir := t.TempDir()
	ca := newTestCA(t)
	caFile := filepath.Join(dir, "node-ca.crt")
	require.NoError(t, os.WriteFile(caFile, ca.pem, 0o600))
	run, err := Start(ctx, logr.Discard(), Config{Addr: "127.0.0.1:0", Dir: filepath.Join(dir, "data"), TLS: true, ClientCAFile: caFile})
	require.NoError(t, err)
	t.Cleanup(func() {
		cancel()
		require.NoError(t, run.Wait())
	})
	client := func(cfg *rest.Config) *kubernetes.Clientset {
		cfg.ContentType = "application/json"
		cs, err := kubernetes.NewForConfig(cfg)
		require.NoError(t, err)
		return cs
	}
	admin := client(&rest.Config{Host: run.URL, BearerToken: run.AdminToken, TLSClientConfig: rest.TLSClientConfig{CAData: run.CAPEM}})
	certPEM, keyPEM := ca.issue(t, "system:node:a", "system:nodes")
	node := client(&rest.Config{Host: run.URL, TLSClientConfig: rest.TLSClientConfig{CAData: run.CAPEM, CertData: certPEM, KeyData: keyPEM}})

	// Registration: the kubelet creates its Node, or finds it.
	_, err = admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = node.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a"}, Spec: corev1.NodeSpec{ProviderID: "nstance://dev/dev-1/a"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = node.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "c"}}, metav1.CreateOptions{})
	require.True(t, apierrors.IsForbidden(err), "creating another node: %v", err)
	_, err = node.CoreV1().Nodes().Get(ctx, "a", metav1.GetOptions{})
	require.NoError(t, err)
	nodes, err := node.CoreV1().Nodes().List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=a"})
	require.NoError(t, err)
	require.Len(t, nodes.Items, 1)
	_, err = node.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	require.True(t, apierrors.IsForbidden(err), "listing every node: %v", err)

	// Status: a strategic merge patch of the conditions, as the kubelet sends.
	patch := []byte(`{"status":{"conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":"2026-11-26T00:00:00Z","lastTransitionTime":"2026-11-26T00:00:00Z"}]}}`)
	got, err := node.CoreV1().Nodes().Patch(ctx, "a", types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	require.NoError(t, err)
	require.Equal(t, "nstance://dev/dev-1/a", got.Spec.ProviderID)
	require.Equal(t, corev1.NodeReady, got.Status.Conditions[0].Type)
	// An existing Node gets the kubelet's default labels through status,
	// as in kube-apiserver; the spec stays.
	got, err = node.CoreV1().Nodes().Patch(ctx, "a", types.StrategicMergePatchType,
		[]byte(`{"metadata":{"labels":{"kubernetes.io/hostname":"a"}},"spec":{"providerID":"kubemark://a"}}`), metav1.PatchOptions{}, "status")
	require.NoError(t, err)
	require.Equal(t, "a", got.Labels["kubernetes.io/hostname"])
	require.Equal(t, "nstance://dev/dev-1/a", got.Spec.ProviderID)
	require.Equal(t, corev1.NodeReady, got.Status.Conditions[0].Type)
	_, err = node.CoreV1().Nodes().Patch(ctx, "b", types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	require.True(t, apierrors.IsForbidden(err), "patching another node's status: %v", err)
	_, err = node.CoreV1().Nodes().Patch(ctx, "b", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
	require.True(t, apierrors.IsForbidden(err))
	require.Equal(t, `nodes "b" is forbidden: node "a" is not allowed to modify node "b"`, err.Error())

	// Heartbeat Lease, named after the node in kube-node-lease.
	holder := "a"
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "a", Namespace: "kube-node-lease"}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}
	lease, err = node.CoordinationV1().Leases("kube-node-lease").Create(ctx, lease, metav1.CreateOptions{})
	require.NoError(t, err)
	now := metav1.NewMicroTime(time.Now())
	lease.Spec.RenewTime = &now
	_, err = node.CoordinationV1().Leases("kube-node-lease").Update(ctx, lease, metav1.UpdateOptions{})
	require.NoError(t, err)
	_, err = node.CoordinationV1().Leases("kube-node-lease").Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "b", Namespace: "kube-node-lease"}}, metav1.CreateOptions{})
	require.True(t, apierrors.IsForbidden(err), "another node's lease: %v", err)

	// Events.
	_, err = node.CoreV1().Events("default").Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "a."},
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: "a"}, Reason: "Starting", Type: corev1.EventTypeNormal}, metav1.CreateOptions{})
	require.NoError(t, err)

	// Pods bound to it: list/watch by node, status updates; others refused.
	for _, p := range []struct{ name, node string }{{"mine", "a"}, {"theirs", "b"}} {
		_, err := admin.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.name},
			Spec: corev1.PodSpec{NodeName: p.node, Containers: []corev1.Container{{Name: "c", Image: "busybox"}},
				Volumes: []corev1.Volume{{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: p.name + "-secret"}}}}}}, metav1.CreateOptions{})
		require.NoError(t, err)
		_, err = admin.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: p.name + "-secret"}}, metav1.CreateOptions{})
		require.NoError(t, err)
	}
	pods, err := node.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=a"})
	require.NoError(t, err)
	require.Len(t, pods.Items, 1)
	mine := pods.Items[0]
	mine.Status.Phase = corev1.PodRunning
	_, err = node.CoreV1().Pods("default").UpdateStatus(ctx, &mine, metav1.UpdateOptions{})
	require.NoError(t, err)
	_, err = node.CoreV1().Pods("default").Patch(ctx, "theirs", types.StrategicMergePatchType, []byte(`{"status":{"phase":"Running"}}`), metav1.PatchOptions{}, "status")
	require.True(t, apierrors.IsForbidden(err), "another node's pod status: %v", err)
	_, err = node.CoreV1().Secrets("default").Get(ctx, "mine-secret", metav1.GetOptions{})
	require.NoError(t, err, "a secret its pod mounts")
	_, err = node.CoreV1().Secrets("default").Get(ctx, "theirs-secret", metav1.GetOptions{})
	require.True(t, apierrors.IsForbidden(err), "another node's pod's secret: %v", err)
	_, err = node.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{})
	require.True(t, apierrors.IsForbidden(err), "listing secrets: %v", err)
	require.Contains(t, err.Error(), `User "system:node:a" cannot list resource "secrets" in API group "" in the namespace "default"`)

	// What a kubelet reads besides.
	_, err = node.CoreV1().Services("").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	_, err = node.StorageV1().CSIDrivers().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	_, err = node.NodeV1().RuntimeClasses().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	_, err = node.Discovery().ServerVersion()
	require.NoError(t, err)
	_, err = node.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	require.True(t, apierrors.IsForbidden(err))

	// The admin is not affected.
	_, err = admin.CoreV1().Nodes().Patch(ctx, "a", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
	require.NoError(t, err)
}
