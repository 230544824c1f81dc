package shardtest_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/nstance-dev/nstance/internal/importedca"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/internal/server/userdata"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// kubernetesCA is a CA as kubeadm writes it (RSA, PKCS#1 key).
func kubernetesCA(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kubernetes"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
}

// nodeConfig gives the worker template a kubelet client certificate from
// the imported CA "kubernetes", a service certificate whose CN comes from a
// var only the config sets, and userdata that waits for the certificate.
func nodeConfig() string {
	cfg := strings.Replace(agentConfig("worker"), `"keys": { "tls": { "type": "ed25519", "certificate": { "common_name": "{{ .InstanceID }}", "dns_names": ["{{ .InstanceID }}.workers.test"], "usages": ["server_auth"] } } },`,
		`"keys": {
        "tls": { "type": "ed25519", "certificate": { "common_name": "{{ .InstanceID }}", "dns_names": ["{{ .InstanceID }}.workers.test"], "usages": ["server_auth"] } },
        "kubelet-client": { "type": "ecdsa-p256", "certificate": { "ca": "kubernetes", "common_name": "system:node:{{ .Instance.Hostname }}",
          "organization": ["system:nodes"], "usages": ["client_auth"] } },
        "svc": { "type": "ecdsa-p256", "certificate": { "ca": "kubernetes", "common_name": "{{ .Vars.svc }}", "usages": ["client_auth"] } },
      },
      "userdata": "#!/bin/sh\nwhile [ ! -s \"$NSTANCE_FILES_DIR/kubelet-client.crt\" ]; do sleep 0.05; done\necho \"joined {{ .Instance.Hostname }} of {{ .Cluster }}/{{ .Shard }}/{{ .Group }}\" > joined\n",`, 1)
	cfg = strings.Replace(cfg, `"vars": { "role": "worker" },`, `"vars": { "role": "worker", "svc": "metrics-reader" },`, 1)
	return strings.Replace(cfg, `"tls": { "kind": "certificate", "path": "tls.crt", "key": "tls" },`,
		`"tls": { "kind": "certificate", "path": "tls.crt", "key": "tls" },
        "kubelet-client": { "kind": "certificate", "path": "kubelet-client.crt", "key": "kubelet-client" },
        "svc": { "kind": "certificate", "path": "svc.crt", "key": "svc" },`, 1)
}

// TestNodeIdentityAndUserDataReachTheInstance runs real agents: each gets
// a kubelet client certificate for its own node name from the imported
// CA, and its template userdata runs once its first files are there; bootstrap
// data sent with UpsertGroup replaces it, and a change of it rotates the group.
func TestNodeIdentityAndUserDataReachTheInstance(t *testing.T) {
	ctx := context.Background()
	objects := memstore.New()
	k, err := secrets.ParseKey([]byte(shardtest.EncryptionKey))
	require.NoError(t, err)
	ring, err := secrets.NewKeyring(k)
	require.NoError(t, err)
	caPEM, caKey := kubernetesCA(t)
	cas := &importedca.Store{Objects: objects, Keys: layout.New(""), Secrets: &secrets.Store{Objects: objects, Ring: ring}}
	ca, err := cas.Import(ctx, "kubernetes", caPEM, caKey, nil, false, time.Now())
	require.NoError(t, err)

	cfg := nodeConfig()
	require.Contains(t, cfg, `"ca": "kubernetes"`)
	a := startAgentShardWith(t, cfg, func(o *shardtest.Options) { o.Store = objects })

	// A tenant var that would set a certificate's CN is refused.
	_, err = a.c.UpsertGroup(ctxT(t), &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{
		GroupId: "workers", Template: "worker", Size: 1, Vars: map[string]string{"svc": "system:kube-controller-manager"}}})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "vars.svc: would change the subject or names of templates.worker.keys.svc.certificate")
	_, err = a.c.CreateInstance(ctxT(t), &nstancev1.CreateInstanceRequest{Template: "worker", Vars: map[string]string{"svc": "admin"}})
	require.Equal(t, codes.InvalidArgument, status.Code(err), "on-demand too: %v", err)
	require.ErrorContains(t, err, "vars.svc")

	a.upsert(t, 1, "")
	waitGroup(t, a.c, "workers", 1)
	id := a.ids(t)[0]
	var cert *x509.Certificate
	require.Eventually(t, func() bool {
		b, _ := pem.Decode([]byte(a.file(id, "kubelet-client.crt")))
		if b == nil {
			return false
		}
		cert, err = x509.ParseCertificate(b.Bytes)
		return err == nil
	}, 20*time.Second, 20*time.Millisecond, "the kubelet client certificate reaches the agent")
	require.Equal(t, "system:node:"+id, cert.Subject.CommonName)
	require.Equal(t, []string{"system:nodes"}, cert.Subject.Organization)
	require.Equal(t, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, cert.ExtKeyUsage)
	_, err = cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	require.NoError(t, err, "signed by the imported CA")
	keyPEM, err := os.ReadFile(filepath.Join(a.stateDir, id, "keys", "kubelet-client.key"))
	require.NoError(t, err, "the key never left the instance")
	require.Contains(t, string(keyPEM), "PRIVATE KEY")

	// The template's userdata ran after the first files, in the instance's directory.
	joined := filepath.Join(a.stateDir, id, "joined")
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(joined)
		return string(b) == "joined "+id+" of test-cluster/test-1/workers\n"
	}, 20*time.Second, 20*time.Millisecond, "userdata ran")
	st, err := a.c.GetInstanceStatus(ctxT(t), &nstancev1.GetInstanceStatusRequest{Lookup: &nstancev1.GetInstanceStatusRequest_InstanceId{InstanceId: id}})
	require.NoError(t, err)
	require.Equal(t, userdata.Sum([]byte("#!/bin/sh\nwhile [ ! -s \"$NSTANCE_FILES_DIR/kubelet-client.crt\" ]; do sleep 0.05; done\necho \"joined "+id+" of test-cluster/test-1/workers\" > joined\n")),
		st.GetInstance().GetUserDataSha256())

	// Bootstrap data sent with the group replaces the template's, byte for
	// byte, and a change of it rolls the group onto the new data.
	boot := func(v string) []byte { return []byte("#!/bin/sh\necho " + v + " > booted\n") }
	up := func(data []byte) *nstancev1.GroupStatus {
		resp, err := a.c.UpsertGroup(ctxT(t), &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{
			GroupId: "workers", Template: "worker", Size: 1, DrainTimeout: durationpb.New(300 * time.Millisecond), UserData: data}})
		require.NoError(t, err)
		return resp.GetGroup()
	}
	g := up(boot("v1"))
	require.Equal(t, userdata.Sum(boot("v1")), g.GetUserDataSha256())
	require.Equal(t, g.GetUserDataSha256(), g.GetSpec().GetUserDataSha256())
	require.Empty(t, g.GetSpec().GetUserData(), "the data itself is never returned")
	var v1 string
	require.Eventually(t, func() bool {
		ids := a.ids(t)
		if len(ids) != 1 || ids[0] == id {
			return false
		}
		v1 = ids[0]
		b, _ := os.ReadFile(filepath.Join(a.stateDir, v1, "booted"))
		return string(b) == "v1\n"
	}, 30*time.Second, 50*time.Millisecond, "the member is replaced by one booted with the group's data")
	ud, err := os.ReadFile(filepath.Join(a.stateDir, v1, "user-data"))
	require.NoError(t, err)
	require.Equal(t, boot("v1"), ud)

	// A read-modify-write that sends the spec back as read keeps the data.
	g.GetSpec().Size = 1
	_, err = a.c.UpsertGroup(ctxT(t), &nstancev1.UpsertGroupRequest{Group: g.GetSpec()})
	require.NoError(t, err)
	require.Equal(t, userdata.Sum(boot("v1")), group(t, a.c, "workers").GetUserDataSha256())
	// A hash the group does not hold is refused.
	bad := &nstancev1.GroupSpec{GroupId: "workers", Template: "worker", Size: 1, UserDataSha256: strings.Repeat("0", 64)}
	_, err = a.c.UpsertGroup(ctxT(t), &nstancev1.UpsertGroupRequest{Group: bad})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	// Data above shard.limits.max_user_data_bytes is refused naming the group and the limit.
	_, err = a.c.UpsertGroup(ctxT(t), &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{
		GroupId: "workers", Template: "worker", Size: 1, UserData: make([]byte, 20<<10)}})
	require.Equal(t, codes.InvalidArgument, status.Code(err))
	require.ErrorContains(t, err, "group workers: user data is 20480 bytes, more than shard.limits.max_user_data_bytes (16384)")

	up(boot("v2"))
	require.Eventually(t, func() bool {
		ids := a.ids(t)
		if len(ids) != 1 || ids[0] == v1 {
			return false
		}
		b, _ := os.ReadFile(filepath.Join(a.stateDir, ids[0], "booted"))
		return string(b) == "v2\n"
	}, 30*time.Second, 50*time.Millisecond, "a new bootstrap data rolls the group")
}
