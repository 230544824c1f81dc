package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/nstance-dev/nstance/internal/devk8s/app"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

// hollowKubeletBinary is the dev stack's hollow kubelet
// (nstance-hollow-kubelet, kubemark's library with everything it writes under
// --root-dir) in the envtest asset directory, or "" when it has not been
// built there.
func hollowKubeletBinary() string {
	dir, _ := kubetest.AssetsDir() // only the hollow kubelet is needed here
	if dir == "" {
		return ""
	}
	bin := filepath.Join(dir, "nstance-hollow-kubelet")
	if _, err := os.Stat(bin); err != nil {
		return ""
	}
	return bin
}

// nodeCA writes a CA to caFile and returns a kubelet client certificate
// and key for node signed by it (CN system:node:<node>, O system:nodes).
func nodeCA(t *testing.T, caFile, node string) (certPEM, keyPEM []byte) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "dev-node-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600))
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

// TestHollowKubelet runs a real kubelet (the dev stack's
// nstance-hollow-kubelet) against dev-k8s with nothing but a node client
// certificate, as the dev stack's instances do: the Node, created first with
// the instance's providerID, becomes Ready and keeps the providerID, and the
// same identity is refused other nodes and Secrets. Everything the kubelet
// writes stays in the test's directory.
func TestHollowKubelet(t *testing.T) {
	bin := hollowKubeletBinary()
	if bin == "" {
		t.Skip("nstance-hollow-kubelet is not in the envtest asset directory (scripts/envtest-assets.sh builds it); skipping the hollow kubelet test")
	}
	ctx, cancel := context.WithCancel(context.Background())
	dir := t.TempDir()
	const name = "hollow-1"
	caFile := filepath.Join(dir, "node-ca.crt")
	certPEM, keyPEM := nodeCA(t, caFile, name)
	run, err := app.Start(ctx, logr.Discard(), app.Config{Addr: "127.0.0.1:0", Dir: filepath.Join(dir, "data"), TLS: true, ClientCAFile: caFile, Controllers: true})
	require.NoError(t, err)
	t.Cleanup(func() {
		cancel()
		require.NoError(t, run.Wait())
	})
	jsonClient := func(cfg *rest.Config) *kubernetes.Clientset {
		cfg.ContentType = "application/json"
		cs, err := kubernetes.NewForConfig(cfg)
		require.NoError(t, err)
		return cs
	}
	nodeClient := jsonClient(&rest.Config{Host: run.URL, TLSClientConfig: rest.TLSClientConfig{CAData: run.CAPEM, CertData: certPEM, KeyData: keyPEM}})
	admin := jsonClient(&rest.Config{Host: run.URL, BearerToken: run.AdminToken, TLSClientConfig: rest.TLSClientConfig{CAData: run.CAPEM}})

	// The instance's user data creates its Node first, with its providerID.
	providerID := "nstance://dev/dev-1/" + name
	_, err = nodeClient.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{ProviderID: providerID}}, metav1.CreateOptions{})
	require.NoError(t, err)

	kc := clientcmdapi.NewConfig()
	kc.Clusters["dev-k8s"] = &clientcmdapi.Cluster{Server: run.URL, CertificateAuthorityData: run.CAPEM}
	kc.AuthInfos["node"] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	kc.Contexts["node"] = &clientcmdapi.Context{Cluster: "dev-k8s", AuthInfo: "node"}
	kc.CurrentContext = "node"
	kubeconfig := filepath.Join(dir, "kubelet.kubeconfig")
	require.NoError(t, clientcmd.WriteToFile(*kc, kubeconfig))

	kubeletDir := filepath.Join(dir, "kubelet")
	logFile, err := os.Create(filepath.Join(dir, "kubelet.log"))
	require.NoError(t, err)
	defer logFile.Close()
	cmd := exec.Command(bin, "--name", name, "--kubeconfig", kubeconfig, "--provider-id", providerID,
		"--root-dir", kubeletDir, "--content-type", "application/json")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		// Only the process this test started, by its PID.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			if data, err := os.ReadFile(logFile.Name()); err == nil {
				t.Logf("kubelet log (last 8 KiB):\n%s", tail(data, 8<<10))
			}
		}
	}()

	started := time.Now()
	deadline := started.Add(2 * time.Minute)
	var node *corev1.Node
	for {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the hollow kubelet exited early: %v", err)
		default:
		}
		node, err = admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		require.NoError(t, err)
		if ready(node) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s not Ready after 2m: conditions %+v", name, node.Status.Conditions)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("node %s Ready after %s; labels %v", name, time.Since(started).Round(time.Millisecond), node.Labels)
	require.Equal(t, providerID, node.Spec.ProviderID, "the kubelet keeps the providerID the Node was created with")
	require.Equal(t, name, node.Labels["kubernetes.io/hostname"], "the kubelet labelled its existing Node (through status)")
	_, err = admin.CoordinationV1().Leases("kube-node-lease").Get(ctx, name, metav1.GetOptions{})
	require.NoError(t, err, "the kubelet heartbeats with its Lease")
	require.Eventually(t, func() bool {
		_, err := admin.StorageV1().CSINodes().Get(ctx, name, metav1.GetOptions{})
		return err == nil
	}, 30*time.Second, 200*time.Millisecond, "the kubelet writes its CSINode")

	// A pod bound to the node, mounting a Secret the node may read because
	// of it: the kubelet runs it (in its fake runtime) and reports it.
	_, err = admin.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "hollow-secret"}, StringData: map[string]string{"k": "v"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = admin.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "hollow-pod"}, Spec: corev1.PodSpec{
		NodeName:   name,
		Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/pause:1"}},
		Volumes:    []corev1.Volume{{Name: "s", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "hollow-secret"}}}},
	}}, metav1.CreateOptions{})
	require.NoError(t, err)
	var phase corev1.PodPhase
	require.Eventually(t, func() bool {
		p, err := admin.CoreV1().Pods("default").Get(ctx, "hollow-pod", metav1.GetOptions{})
		if err == nil {
			phase = p.Status.Phase
		}
		return phase == corev1.PodRunning
	}, time.Minute, 200*time.Millisecond, "the kubelet reports its pod Running (last phase %q)", phase)

	_, err = admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "other"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	_, err = nodeClient.CoreV1().Nodes().Patch(ctx, "other", types.MergePatchType, []byte(`{"metadata":{"labels":{"stolen":"true"}}}`), metav1.PatchOptions{})
	require.True(t, apierrors.IsForbidden(err), "patching another Node: %v", err)
	_, err = nodeClient.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{})
	require.True(t, apierrors.IsForbidden(err), "listing Secrets: %v", err)
	var status *apierrors.StatusError
	require.True(t, errors.As(err, &status))
	require.Equal(t, int32(403), status.ErrStatus.Code)

	// Nothing the kubelet asked for was refused or missing.
	logData, err := os.ReadFile(logFile.Name())
	require.NoError(t, err)
	for _, bad := range []string{"Failed to watch", "forbidden", "could not find the requested resource", "not a known field selector"} {
		require.NotContains(t, string(logData), bad, "kubelet log")
	}
	// Its fake runtime's socket is in its own directory, not under /tmp.
	_, err = os.Stat(filepath.Join(kubeletDir, "runtime.sock"))
	require.NoError(t, err)
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
