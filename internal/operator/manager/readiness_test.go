package manager_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	opwebhook "github.com/nstance-dev/nstance/internal/operator/webhook"
	"github.com/nstance-dev/nstance/internal/testing/portpick"
)

// selfSignedServing writes tls.crt and tls.key for 127.0.0.1 into dir: a
// self-signed certificate that is also the webhook's CA bundle.
func selfSignedServing(t *testing.T, dir string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tls.crt"), certPEM, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	return certPEM
}

func readyz(addr string) int {
	resp, err := http.Get("http://" + addr + "/readyz") //nolint:noctx // a probe, as the kubelet sends it
	if err != nil {
		return 0
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// TestReadyWithOneShardDown: with one of two shards down the operator stays
// Ready (/readyz 200) and its webhook answers admission requests the API
// server sends it, while the metrics and Down report the outage.
func TestReadyWithOneShardDown(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "shard-a", "shard-b")
	f.putNonce(t)
	o := f.options(t)
	reg := prometheus.NewRegistry()
	o.MetricsRegistry = reg
	certDir := t.TempDir()
	caPEM := selfSignedServing(t, certDir)
	o.DisableWebhooks = false
	o.WebhookHost, o.WebhookPort, o.WebhookCertDir = "127.0.0.1", portpick.Port(t), certDir
	o.ProbeAddr = portpick.Addr(t)
	r := startOperator(t, o)
	r.waitImported(t)
	require.Eventually(t, func() bool {
		return r.op.Conns.Healthy("shard-a") && r.op.Conns.Healthy("shard-b") && readyz(o.ProbeAddr) == http.StatusOK
	}, waitLong, tick, "ready with both shards up")

	// The webhook, registered with the API server for a namespace of its
	// own that the operator does not reconcile.
	whNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "webhook-"}}
	require.NoError(t, env.Client.Create(ctx, whNS))
	url := fmt.Sprintf("https://127.0.0.1:%d%s", o.WebhookPort, opwebhook.Path)
	vwc := &admissionv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "nstance-readiness-"},
		Webhooks: []admissionv1.ValidatingWebhook{{
			Name:         "vnstancemachinepool.infrastructure.cluster.x-k8s.io",
			ClientConfig: admissionv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
			Rules: []admissionv1.RuleWithOperations{{
				Operations: []admissionv1.OperationType{admissionv1.Update},
				Rule: admissionv1.Rule{APIGroups: []string{infrav1.GroupVersion.Group}, APIVersions: []string{infrav1.GroupVersion.Version},
					Resources: []string{"nstancemachinepools"}},
			}},
			FailurePolicy:           ptr.To(admissionv1.Fail),
			SideEffects:             ptr.To(admissionv1.SideEffectClassNone),
			AdmissionReviewVersions: []string{"v1"},
			NamespaceSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: whNS.Name}},
		}},
	}
	require.NoError(t, env.Client.Create(ctx, vwc))
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), vwc) })

	f.shards["shard-b"].stop()
	require.Eventually(t, func() bool { return !r.op.Conns.Healthy("shard-b") }, waitLong, tick)
	require.Equal(t, []string{"shard-b"}, r.op.Conns.Down())
	require.True(t, r.op.Conns.Healthy("shard-a"))
	require.Equal(t, map[string]float64{"shard-a": 1, "shard-b": 0}, shardUp(t, reg), "nstance_operator_shard_up reports the outage")
	require.Equal(t, http.StatusOK, readyz(o.ProbeAddr), "one shard down leaves the operator ready")

	// A static pool's fixed fields: the webhook refuses the change (the API
	// server picks a new configuration up asynchronously: retry as a dry run
	// until the webhook answers), and accepts an allowed one.
	pool := &infrav1.NstanceMachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: whNS.Name, GenerateName: "static-", Annotations: map[string]string{opwebhook.StaticAnnotation: "true"}},
		Spec:       infrav1.NstanceMachinePoolSpec{Group: "static", Shards: []string{"shard-a"}, Template: "worker"},
	}
	require.NoError(t, env.Client.Create(ctx, pool))
	changed := pool.DeepCopy()
	changed.Spec.Shards = []string{"shard-a", "shard-b"}
	refused := regexp.MustCompile(`admission webhook "[^"]+" denied the request: .*spec.shards: Forbidden: immutable on a static pool`)
	var last error
	require.Eventually(t, func() bool {
		last = env.Client.Update(ctx, changed.DeepCopy(), client.DryRunAll)
		return last != nil && refused.MatchString(last.Error())
	}, waitLong, tick, "the webhook never refused the change; last answer: %v", last)
	allowed := pool.DeepCopy()
	allowed.Spec.InstanceType = "large"
	require.NoError(t, env.Client.Update(ctx, allowed), "the webhook allows a change to a free field")
	require.Equal(t, http.StatusOK, readyz(o.ProbeAddr))
}

// shardUp reads nstance_operator_shard_up by shard from the registry.
func shardUp(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	up := map[string]float64{}
	for _, mf := range families {
		if mf.GetName() != "nstance_operator_shard_up" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "shard" {
					up[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	return up
}
