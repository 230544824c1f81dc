package packaging_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	opmanager "github.com/nstance-dev/nstance/internal/operator/manager"
	opwebhook "github.com/nstance-dev/nstance/internal/operator/webhook"
	"github.com/nstance-dev/nstance/internal/testing/portpick"
	"github.com/nstance-dev/nstance/internal/testing/syncbuf"
)

// webhookPort is the non-default port the chart is rendered with; another
// free port stands in only when something else on the machine holds it.
func webhookPort(t *testing.T) int {
	t.Helper()
	const want = 9555
	if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", want)); err == nil {
		require.NoError(t, l.Close())
		return want
	}
	port := portpick.Port(t)
	t.Logf("port %d is in use on this machine; rendering with webhook.port=%d instead", want, port)
	return port
}

// servingCert writes tls.crt and tls.key for 127.0.0.1 into dir and returns
// the PEM of the CA that signed them.
func servingCert(t *testing.T, dir string) []byte {
	t.Helper()
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "webhook test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	leafDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(2),
		Subject: pkix.Name{CommonName: "127.0.0.1"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}},
		ca, &key.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(dir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
}

// TestWebhookOnNonDefaultPort renders the chart with a webhook port other
// than 9443, checks that the port reaches the operator's --webhook-port, the
// container port and the Service's targetPort, then runs the operator binary
// with the rendered arguments and environment against the API server and has
// the API server send it an admission request that it must refuse.
func TestWebhookOnNonDefaultPort(t *testing.T) {
	port := webhookPort(t)
	e := apiServer(t)
	ctx := context.Background()
	const ns = "nstance-webhook-port"
	objs := render(t, rendering{name: "webhook-port", namespace: ns, args: []string{
		"--set", fmt.Sprintf("webhook.port=%d", port), "--set", "config.clusterID=webhook-test",
		"--set", "config.shards.a.registrationAddr=127.0.0.1:1", "--set", "config.shards.a.operatorAddr=127.0.0.1:2",
	}})

	// One port everywhere: the operator's argument, the container port and
	// the Service's target.
	_, c := deployment(t, objs)
	var argPort int
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--webhook-port="); ok {
			n, err := strconv.Atoi(v)
			require.NoError(t, err, a)
			argPort = n
		}
	}
	require.Equal(t, port, argPort, "container args %v", c.Args)
	idx := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "webhook" })
	require.GreaterOrEqual(t, idx, 0, "no container port named webhook")
	require.EqualValues(t, port, c.Ports[idx].ContainerPort)
	svcObj, ok := find(objs, "Service", release+"-webhook")
	require.True(t, ok)
	var svc corev1.Service
	into(t, svcObj, &svc)
	require.Len(t, svc.Spec.Ports, 1)
	target := svc.Spec.Ports[0].TargetPort
	if target.StrVal != "" {
		require.Equal(t, c.Ports[idx].Name, target.StrVal, "the Service targets a port the container does not name")
	} else {
		require.EqualValues(t, port, target.IntVal)
	}
	vwcObj, ok := find(objs, "ValidatingWebhookConfiguration", "")
	require.True(t, ok)
	var vwc admissionv1.ValidatingWebhookConfiguration
	into(t, vwcObj, &vwc)
	require.Len(t, vwc.Webhooks, 2)
	for i, want := range []string{opwebhook.Path, opwebhook.MachinePoolPath} {
		w := vwc.Webhooks[i]
		require.NotNil(t, w.ClientConfig.Service)
		require.Equal(t, svc.Name, w.ClientConfig.Service.Name)
		require.EqualValues(t, svc.Spec.Ports[0].Port, *w.ClientConfig.Service.Port)
		require.Equal(t, want, *w.ClientConfig.Service.Path, "the configuration calls a path the operator does not serve")
	}

	// The rendered CRDs, a namespace, and a Lease held by another replica:
	// this operator stays a standby, which must answer admission requests
	// all the same (the Service sends them to any replica).
	kubectl(t, e, encode(t, ofKind(objs, "CustomResourceDefinition")), "apply", "-f", "-")
	ensureNamespaces(t, e, ns)
	now := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: opmanager.LeaderElectionID},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("another-replica"), LeaseDurationSeconds: ptr.To[int32](3600),
			AcquireTime: &now, RenewTime: &now}}
	require.NoError(t, client.IgnoreAlreadyExists(e.Client.Create(ctx, lease)))

	// The operator, built from this tree, with the rendered arguments and
	// environment. Only what cannot hold outside a pod is added after them
	// (the last value of a flag wins): the kubeconfig, the paths of the
	// mounted config file and certificate, and loopback binds.
	dir := t.TempDir()
	bin := filepath.Join(dir, "nstance-operator")
	build := exec.Command("go", "build", "-o", bin, "./cmd/nstance-operator")
	build.Dir = root
	out, err := build.CombinedOutput()
	require.NoError(t, err, "go build:\n%s", out)
	cmObj, ok := find(objs, "ConfigMap", release+"-config")
	require.True(t, ok)
	var cm corev1.ConfigMap
	into(t, cmObj, &cm)
	cfgPath := filepath.Join(dir, "config.yaml")
	require.NoError(t, os.WriteFile(cfgPath, []byte(cm.Data["config.yaml"]), 0o600))
	certDir := filepath.Join(dir, "certs")
	caPEM := servingCert(t, certDir)
	env := []string{"HOME=" + dir}
	for _, v := range c.Env {
		value := v.Value
		if v.ValueFrom != nil {
			require.Equal(t, "metadata.namespace", v.ValueFrom.FieldRef.FieldPath, v.Name)
			value = ns
		}
		env = append(env, v.Name+"="+value)
	}
	extra := []string{"--kubeconfig=" + e.Kubeconfig, "--config=" + cfgPath, "--webhook-cert-dir=" + certDir,
		"--webhook-host=127.0.0.1", "--health-probe-bind-address=127.0.0.1:0", "--diagnostics-address=127.0.0.1:0"}
	cmd := exec.Command(bin, append(slices.Clone(c.Args), extra...)...)
	cmd.Env = env
	var logs syncbuf.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case err := <-exited:
			return err
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
			return errors.New("operator ignored SIGTERM for 30s")
		}
	}
	t.Cleanup(func() { _ = stop() })

	// Wait for the webhook server: a TLS handshake on the port that
	// verifies against the test CA, i.e. this operator and no one else.
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(caPEM))
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(3 * time.Minute)
	for {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"})
		if err == nil {
			require.NoError(t, conn.Close())
			break
		}
		select {
		case werr := <-exited:
			stopped = true
			t.Fatalf("operator exited (%v) before serving webhooks on %s:\n%s", werr, addr, logs.String())
		case <-time.After(100 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "no webhook server on %s after 3 minutes (last error %v):\n%s", addr, err, logs.String())
	}

	// The version is the first thing logged, as JSON (the output is not a
	// terminal and the image sets no other format).
	first, _, _ := strings.Cut(logs.String(), "\n")
	var started map[string]any
	require.NoError(t, json.Unmarshal([]byte(first), &started), "first log line: %s", first)
	require.Equal(t, "starting", started["msg"])
	require.Equal(t, "nstance-operator", started["binary"])
	require.NotEmpty(t, started["version"], "the binary's version (go build may record a VCS one; internal/version)")

	// The rendered webhook configuration, pointed at the operator directly
	// (envtest cannot route to Services) and limited to this namespace so
	// other tests' pools never reach it.
	for i := range vwc.Webhooks {
		w := &vwc.Webhooks[i]
		w.ClientConfig.URL = ptr.To(fmt.Sprintf("https://%s%s", addr, *w.ClientConfig.Service.Path))
		w.ClientConfig.Service = nil
		w.ClientConfig.CABundle = caPEM
		w.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}}
	}
	vwc.ResourceVersion = ""
	require.NoError(t, e.Client.Create(ctx, &vwc))
	t.Cleanup(func() { _ = e.Client.Delete(context.Background(), &vwc) })

	pool := &infrav1.NstanceMachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "static-", Annotations: map[string]string{opwebhook.StaticAnnotation: "true"}},
		Spec:       infrav1.NstanceMachinePoolSpec{Group: "static", Shards: []string{"a"}, Template: "worker"},
	}
	require.NoError(t, e.Client.Create(ctx, pool))
	changed := pool.DeepCopy()
	changed.Spec.Shards = []string{"a", "b"}
	// The API server picks the new configuration up asynchronously: repeat
	// the change as a dry run until the webhook answers it.
	refused := regexp.MustCompile(`admission webhook "[^"]+" denied the request: .*spec.shards: Forbidden: immutable on a static pool`)
	var last error
	require.Eventually(t, func() bool {
		last = e.Client.Update(ctx, changed.DeepCopy(), client.DryRunAll)
		return last != nil && refused.MatchString(last.Error())
	}, 2*time.Minute, 200*time.Millisecond, "the webhook never refused the change; last answer: %v\noperator:\n%s", last, logs.String())
	// And for real: refused, nothing stored.
	err = e.Client.Update(ctx, changed.DeepCopy())
	require.Error(t, err)
	require.Regexp(t, refused, err.Error())
	var stored infrav1.NstanceMachinePool
	require.NoError(t, e.Client.Get(ctx, client.ObjectKeyFromObject(pool), &stored))
	require.Equal(t, []string{"a"}, stored.Spec.Shards)
	// A change the webhook allows goes through it and is stored.
	stored.Spec.InstanceType = "large"
	require.NoError(t, e.Client.Update(ctx, &stored))

	// The MachinePool of a static pool cannot be scaled; the label selects
	// it, other MachinePools never reach the operator.
	newMP := func(static bool) *clusterv1.MachinePool {
		mp := &clusterv1.MachinePool{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: "mp-"},
			Spec: clusterv1.MachinePoolSpec{ClusterName: "webhook-test", Replicas: ptr.To[int32](2),
				Template: clusterv1.MachineTemplateSpec{Spec: clusterv1.MachineSpec{ClusterName: "webhook-test",
					Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr.To("")},
					InfrastructureRef: clusterv1.ContractVersionedObjectReference{
						APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceMachinePool", Name: pool.Name}}}},
		}
		if static {
			mp.Labels = map[string]string{opwebhook.StaticLabel: "true"}
		}
		require.NoError(t, e.Client.Create(ctx, mp))
		return mp
	}
	staticMP := newMP(true)
	staticMP.Spec.Replicas = ptr.To[int32](5)
	err = e.Client.Update(ctx, staticMP)
	require.Error(t, err)
	require.Regexp(t, `admission webhook "[^"]+" denied the request: .*spec.replicas: Forbidden: the static group is sized by the shard config files \(2 instances\)`, err.Error())
	dynamicMP := newMP(false)
	dynamicMP.Spec.Replicas = ptr.To[int32](5)
	require.NoError(t, e.Client.Update(ctx, dynamicMP))

	require.NoError(t, e.Client.Delete(ctx, &vwc))
	require.NoError(t, stop(), "the operator stops cleanly on SIGTERM:\n%s", logs.String())
}
