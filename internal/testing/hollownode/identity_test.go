package hollownode_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	"github.com/nstance-dev/nstance/internal/testing/bindtest"
	"github.com/nstance-dev/nstance/internal/testing/hollownode"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

// testCA is a node CA for the test: the workload cluster's CA that signs
// node client certificates.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "hollownode-test-node-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(2 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// nodeCert writes the client certificate and key of node name
// (CN=system:node:<name>, O=system:nodes) into dir.
func (ca *testCA) nodeCert(t *testing.T, dir, name string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "system:node:" + name, Organization: []string{"system:nodes"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     ca.cert.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	return certFile, keyFile
}

// The node identity story against a real kube-apiserver with the Node
// authorizer and NodeRestriction: a node creates its own Node with the
// providerID, the hollow kubelet keeps it and makes the Node Ready, runs a
// pod bound to it, and its certificate can touch neither another Node nor
// Secrets.
func TestNodeIdentityAgainstRealAPIServer(t *testing.T) {
	if _, err := hollownode.Binary(); err != nil {
		t.Fatal(err)
	}
	ca := newTestCA(t)
	env, stop, err := kubetest.StartEnvWith(kubetest.Options{
		APIServerArgs: map[string]string{
			"authorization-mode":       "Node,RBAC",
			"enable-admission-plugins": "NodeRestriction",
		},
		ClientCAs: ca.pem,
	})
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("stop envtest: %v", err)
		}
	})

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin, err := kubernetes.NewForConfig(env.Config)
	require.NoError(t, err)

	dir := t.TempDir()
	caFile := filepath.Join(dir, "apiserver-ca.crt")
	require.NoError(t, os.WriteFile(caFile, env.Config.CAData, 0o600))
	const nameA, nameB = "hollow-a", "hollow-b"
	certA, keyA := ca.nodeCert(t, dir, nameA)
	nodeConfig := &rest.Config{
		Host:            env.Config.Host,
		TLSClientConfig: rest.TLSClientConfig{CAFile: caFile, CertFile: certA, KeyFile: keyA},
	}
	asA, err := kubernetes.NewForConfig(nodeConfig)
	require.NoError(t, err)

	// Node B exists (the administrator made it) before A tries to touch it.
	_, err = admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nameB}}, metav1.CreateOptions{})
	require.NoError(t, err)

	// A creates its own Node with the instance's providerID, as the
	// instance's user data will before it starts the kubelet.
	providerID := "nstance://test/dev-1/" + nameA
	_, err = asA.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nameA},
		Spec:       corev1.NodeSpec{ProviderID: providerID},
	}, metav1.CreateOptions{})
	require.NoError(t, err, "node A creating its own Node")

	// Checked after the node's cleanup (registered below, so it runs first):
	// nothing it started outlives the test.
	var node *hollownode.Node
	t.Cleanup(func() {
		if node == nil {
			return
		}
		if err := syscall.Kill(node.PID, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("kubemark pid %d still exists after the test (kill -0: %v)", node.PID, err)
		}
		for _, p := range node.ScratchPaths() {
			if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s left behind (stat: %v)", p, err)
			}
		}
	})
	started := time.Now()
	node = hollownode.Start(t, hollownode.Options{
		Name: nameA, Server: env.Config.Host, CAFile: caFile, CertFile: certA, KeyFile: keyA,
		ProviderID: providerID,
	})
	require.Len(t, node.ScratchPaths(), 2, "root directory and runtime socket under /tmp")
	ready, err := node.WaitReady(ctx)
	require.NoError(t, err)
	t.Logf("Node %s Ready %s after start (pid %d, kubelet port %d)", nameA, time.Since(started).Round(time.Millisecond), node.PID, node.Port)
	require.Equal(t, providerID, ready.Spec.ProviderID, "the kubelet kept the providerID of the Node it found")
	if ips, err := bindtest.ListeningIPs(node.PID, node.Port); err == nil {
		t.Logf("kubelet port %d bound to %v (kubemark has no bind address flag)", node.Port, ips)
	}

	// A pod bound to A runs. envtest has no controller-manager: the
	// ServiceAccount is created here and no token is mounted (the
	// kube-root-ca.crt ConfigMap the projected token needs would not exist).
	_, err = admin.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		require.NoError(t, err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "on-a", Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:                     nameA,
			AutomountServiceAccountToken: ptr.To(false),
			Containers:                   []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
		},
	}
	_, err = admin.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
	require.NoError(t, err)
	bound := time.Now()
	waitPodRunning(ctx, t, admin, "default", "on-a")
	t.Logf("pod on %s Running %s after creation", nameA, time.Since(bound).Round(time.Millisecond))
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", node.PID)); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "VmRSS:") {
				t.Logf("kubemark %s", strings.Join(strings.Fields(l), " "))
			}
		}
	}

	// NodeRestriction: A may not modify B.
	_, err = asA.CoreV1().Nodes().Patch(ctx, nameB, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"touched-by":"hollow-a"}}}`), metav1.PatchOptions{})
	require.Truef(t, apierrors.IsForbidden(err), "node A patching Node B: want 403 Forbidden, got %v", err)
	// Node authorizer: A may not list Secrets.
	_, err = asA.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{})
	require.Truef(t, apierrors.IsForbidden(err), "node A listing Secrets: want 403 Forbidden, got %v", err)
	// ...but it may still patch its own Node (the refusals are about B).
	_, err = asA.CoreV1().Nodes().Patch(ctx, nameA, types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"nstance.dev/test":"own"}}}`), metav1.PatchOptions{})
	require.NoError(t, err, "node A patching its own Node")

	// B's own kubelet, speaking JSON (as it must to dev-k8s), takes over
	// the Node the administrator made.
	certB, keyB := ca.nodeCert(t, dir, nameB)
	nodeB := hollownode.Start(t, hollownode.Options{
		Name: nameB, Server: env.Config.Host, CAFile: caFile, CertFile: certB, KeyFile: keyB,
		ContentType: hollownode.ContentTypeJSON,
	})
	readyB, err := nodeB.WaitReady(ctx)
	require.NoError(t, err, "node B with JSON")
	// The kubelet leaves an existing Node's providerID alone, even an empty
	// one: its kubemark://NAME goes only into a Node it creates itself.
	require.Empty(t, readyB.Spec.ProviderID)
	require.NoError(t, nodeB.Stop())

	require.NoError(t, node.Stop())
	for _, p := range node.ScratchPaths() {
		_, err := os.Lstat(p)
		require.ErrorIs(t, err, os.ErrNotExist, "%s after Stop", p)
	}
}

// waitPodRunning watches the pod until its phase is Running.
func waitPodRunning(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, name string) {
	t.Helper()
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (k8sruntime.Object, error) {
			o.FieldSelector = sel
			return cs.CoreV1().Pods(ns).List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return cs.CoreV1().Pods(ns).Watch(ctx, o)
		},
	}
	var phase corev1.PodPhase
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, nil, func(e watch.Event) (bool, error) {
		p, ok := e.Object.(*corev1.Pod)
		if !ok {
			return false, nil
		}
		phase = p.Status.Phase
		return phase == corev1.PodRunning, nil
	})
	require.NoErrorf(t, err, "pod %s/%s never Running (last phase %q)", ns, name, phase)
}
