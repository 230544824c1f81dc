package capicontract_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nstance-dev/nstance/internal/importedca"
	"github.com/nstance-dev/nstance/internal/layout"
	"github.com/nstance-dev/nstance/internal/secrets"
	"github.com/nstance-dev/nstance/internal/server/provider/process"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/pkg/objstore/memstore"
)

// agentBinary builds cmd/nstance-agent once per test binary run; TestMain
// removes it (agentBinDir) after every run (-count=N reuses it).
var agentBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "nstance-agent-bin-")
	if err != nil {
		return "", err
	}
	agentBinDir = dir
	bin := filepath.Join(dir, "nstance-agent")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/nstance-dev/nstance/cmd/nstance-agent").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("building nstance-agent: %v\n%s", err, out)
	}
	return bin, nil
})

// nodeTemplate gives the shard's worker template a kubelet client
// certificate from the imported CA "kubernetes" at kubelet/client.crt.
func nodeTemplate(cfg string) string {
	old := `"worker": { "kind": "worker", "arch": "amd64", "instance_type": "test.small", "subnet_pool": "default", "vars": { "role": "worker" } },`
	return strings.Replace(cfg, old, `"worker": { "kind": "worker", "arch": "amd64", "instance_type": "test.small", "subnet_pool": "default", "vars": { "role": "worker" },
      "keys": { "kubelet-client": { "type": "ecdsa-p256", "certificate": { "ca": "kubernetes",
        "common_name": "system:node:{{ .Instance.Hostname }}", "organization": ["system:nodes"], "usages": ["client_auth"] } } },
      "files": { "kubelet-client": { "kind": "certificate", "path": "kubelet/client.crt", "key": "kubelet-client" } } },`, 1)
}

// nodeBootstrap is the bootstrap data of the test's MachinePool, as a
// bootstrap provider would write it: it joins the instance to the API
// server as a hollow kubelet with the certificate Nstance issued.
func nodeBootstrap(server, caFile, kubelet string) string {
	return `#!/bin/sh
# test bootstrap data: join as a hollow kubelet
set -eu
crt="$NSTANCE_FILES_DIR/kubelet/client.crt"
key="$NSTANCE_KEYS_DIR/kubelet-client.key"
while [ ! -s "$crt" ] || [ ! -s "$key" ]; do sleep 0.1; done
umask 077
mkdir -p kubelet
cat > kubelet/kubeconfig <<KUBECONFIG
apiVersion: v1
kind: Config
clusters: [{name: workload, cluster: {server: "` + server + `", certificate-authority: "` + caFile + `"}}]
users: [{name: node, user: {client-certificate: "$crt", client-key: "$key"}}]
contexts: [{name: workload, context: {cluster: workload, user: node}}]
current-context: workload
KUBECONFIG
exec "` + kubelet + `" --name "$NSTANCE_INSTANCE_ID" --kubeconfig kubelet/kubeconfig --provider-id "$NSTANCE_PROVIDER_ID" --root-dir "$PWD/kubelet/root"
`
}

// TestMachinePoolInstancesBecomeNodes runs the whole chain against a real
// kube-apiserver authorizing with Node,RBAC and NodeRestriction, core
// Cluster API's controllers, the operator and a real shard whose process
// provider runs real agents: a MachinePool of 3 whose bootstrap Secret holds
// a plain script; every instance boots with exactly those bytes and joins
// as a hollow kubelet with nothing but the certificate Nstance issued for
// its own node name, so core CAPI finds 3 ready replicas with node
// references; the node identity can do nothing to other Nodes or Secrets;
// a pod runs on each node; scaling to 2 evicts the pod of the node that
// goes, and its Node goes away.
func TestMachinePoolInstancesBecomeNodes(t *testing.T) {
	ctx := context.Background()
	kubelet := filepath.Join(env.AssetsDir, "nstance-hollow-kubelet")
	if _, err := os.Stat(kubelet); err != nil {
		t.Fatalf("%s is missing: run scripts/envtest-assets.sh (it builds the hollow kubelet beside kube-apiserver): %v", kubelet, err)
	}
	bin, err := agentBinary()
	require.NoError(t, err)

	// Nstance holds the workload cluster's node CA as the imported CA "kubernetes".
	objects := memstore.New()
	k, err := secrets.ParseKey([]byte(shardtest.EncryptionKey))
	require.NoError(t, err)
	ring, err := secrets.NewKeyring(k)
	require.NoError(t, err)
	cas := &importedca.Store{Objects: objects, Keys: layout.New(""), Secrets: &secrets.Store{Objects: objects, Ring: ring}}
	_, err = cas.Import(ctx, "kubernetes", nodeCACert, nodeCAKey, nil, false, time.Now())
	require.NoError(t, err)

	stateDir := t.TempDir()
	prov, err := process.New(process.Config{Command: []string{bin}, StateDir: stateDir, StopTimeout: 2 * time.Second,
		Env: []string{"NSTANCE_METRICS_INTERVAL=200ms", "NSTANCE_RECONNECT_MIN=100ms", "NSTANCE_RECONNECT_MAX=1s"}})
	require.NoError(t, err)
	t.Cleanup(func() {
		list, _ := prov.List(context.Background())
		for _, inst := range list {
			_ = prov.Delete(context.Background(), inst.InstanceID)
		}
	})
	f := newFixtureWith(t, env.Client, func(o *shardtest.Options) {
		o.Store, o.Provider = objects, prov
		o.ConfigJSONC = nodeTemplate(shardtest.Config(clusterID, shardID, "process"))
		require.Contains(t, o.ConfigJSONC, `"ca": "kubernetes"`)
	})

	// The bootstrap data: a plain Secret with value, as a bootstrap provider writes it.
	caFile := filepath.Join(t.TempDir(), "apiserver-ca.crt")
	require.NoError(t, os.WriteFile(caFile, env.Config.CAData, 0o644))
	boot := nodeBootstrap(env.Config.Host, caFile, kubelet)
	var sec corev1.Secret
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: bootstrapSecret}, &sec))
	sec.Data = map[string][]byte{"value": []byte(boot)}
	require.NoError(t, env.Client.Update(ctx, &sec))

	bindCAPIWorkloadRole(t, f.ns)
	startOperator(t, f.opts)
	logs := &capiLog{}
	startCAPI(t, f.ns, logs.logger())
	t.Cleanup(func() {
		if t.Failed() {
			for _, line := range logs.matching("rror") {
				t.Log(line)
			}
		}
	})
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		// What each instance's agent, user data and kubelet said.
		entries, _ := os.ReadDir(stateDir)
		for _, e := range entries {
			log, _ := os.ReadFile(filepath.Join(stateDir, e.Name(), "agent.log"))
			if len(log) > 4000 {
				log = log[len(log)-4000:]
			}
			t.Logf("instance %s agent.log (tail):\n%s", e.Name(), log)
		}
		var nodes corev1.NodeList
		_ = env.Client.List(context.Background(), &nodes)
		for _, n := range nodes.Items {
			t.Logf("node %s providerID %s ready %v", n.Name, n.Spec.ProviderID, nodeReady(n))
		}
	})
	f.createPool(t, "nodes", 3, 30*time.Second)
	key := client.ObjectKey{Namespace: f.ns, Name: "nodes"}

	readyNodes := func(ids map[string]string) bool {
		for id, pid := range ids {
			n, ok := nodeByProviderID(t, pid)
			if !ok || n.Name != id || !nodeReady(n) {
				return false
			}
		}
		return true
	}
	var members map[string]string // instance id -> provider id
	start := time.Now()
	require.Eventually(t, func() bool {
		members = map[string]string{}
		for id, inst := range groupInstances(t, f, "nodes") {
			members[id] = inst.GetProviderId()
		}
		if len(members) != 3 || !readyNodes(members) {
			return false
		}
		var mp clusterv1.MachinePool
		if !get(t, key, &mp) || ptr.Deref(mp.Status.Replicas, -1) != 3 || ptr.Deref(mp.Status.ReadyReplicas, -1) != 3 {
			return false
		}
		ms := poolMachines(t, f.ns, "nodes")
		if len(ms) != 3 {
			return false
		}
		for id := range members {
			m, ok := ms[id]
			if !ok || !m.Status.NodeRef.IsDefined() || m.Status.NodeRef.Name != id {
				return false
			}
		}
		return true
	}, 3*time.Minute, 200*time.Millisecond, "3 hollow kubelets register Ready Nodes with the instances' provider IDs and core CAPI counts 3 ready replicas")
	t.Logf("3 Ready Nodes with node references %s after the MachinePool was created", time.Since(start).Round(100*time.Millisecond))

	for id := range members {
		ud, err := os.ReadFile(filepath.Join(stateDir, id, "user-data"))
		require.NoError(t, err)
		require.Equal(t, boot, string(ud), "instance %s booted with the bootstrap Secret's bytes", id)
	}

	// With node A's certificate (issued by Nstance, read off instance A),
	// another Node cannot be patched and Secrets cannot be listed.
	ids := make([]string, 0, len(members))
	for id := range members {
		ids = append(ids, id)
	}
	a, b := ids[0], ids[1]
	nodeA, err := kubernetes.NewForConfig(&rest.Config{Host: env.Config.Host, TLSClientConfig: rest.TLSClientConfig{
		CAData: env.Config.CAData, CertFile: filepath.Join(stateDir, a, "files", "kubelet", "client.crt"),
		KeyFile: filepath.Join(stateDir, a, "keys", "kubelet-client.key")}})
	require.NoError(t, err)
	_, err = nodeA.CoreV1().Nodes().Patch(ctx, b, types.MergePatchType, []byte(`{"metadata":{"labels":{"stolen":"yes"}}}`), metav1.PatchOptions{})
	require.True(t, apierrors.IsForbidden(err), "node %s patching node %s: %v", a, b, err)
	_, err = nodeA.CoreV1().Secrets(f.ns).List(ctx, metav1.ListOptions{})
	require.True(t, apierrors.IsForbidden(err), "node %s listing Secrets: %v", a, err)
	_, err = nodeA.CoreV1().Nodes().Get(ctx, a, metav1.GetOptions{})
	require.NoError(t, err, "the same identity reads its own Node")

	// A pod bound to each node runs there.
	require.NoError(t, env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "default"}}))
	for _, id := range ids {
		require.NoError(t, env.Client.Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "app-" + id},
			Spec: corev1.PodSpec{NodeName: id, AutomountServiceAccountToken: ptr.To(false), TerminationGracePeriodSeconds: ptr.To[int64](0),
				Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}}},
		}))
	}
	require.Eventually(t, func() bool {
		for _, id := range ids {
			var p corev1.Pod
			if !get(t, client.ObjectKey{Namespace: f.ns, Name: "app-" + id}, &p) || p.Status.Phase != corev1.PodRunning {
				return false
			}
		}
		return true
	}, time.Minute, 100*time.Millisecond, "the hollow kubelets run the pods bound to them")

	// Scaling to 2: the instance that goes is drained (its pod evicted) and its Node goes away.
	var mp clusterv1.MachinePool
	require.True(t, get(t, key, &mp))
	mp.Spec.Replicas = ptr.To[int32](2)
	require.NoError(t, env.Client.Update(ctx, &mp))
	var gone string
	require.Eventually(t, func() bool {
		left := groupInstances(t, f, "nodes")
		if len(left) != 2 {
			return false
		}
		for id := range members {
			if _, ok := left[id]; !ok {
				gone = id
			}
		}
		if gone == "" {
			return false
		}
		if _, ok := nodeByProviderID(t, members[gone]); ok {
			return false
		}
		return !podExists(t, f.ns, "app-"+gone)
	}, drainWait, 200*time.Millisecond, "scaling to 2 evicts the pod of the instance that goes and its Node goes away")
	for id := range members {
		if id == gone {
			continue
		}
		var p corev1.Pod
		require.True(t, get(t, client.ObjectKey{Namespace: f.ns, Name: "app-" + id}, &p))
		require.Equal(t, corev1.PodRunning, p.Status.Phase, "the pods of the nodes that stay keep running")
		n, ok := nodeByProviderID(t, members[id])
		require.True(t, ok && nodeReady(n))
	}
	require.Eventually(t, func() bool {
		require.True(t, get(t, key, &mp))
		return ptr.Deref(mp.Status.ReadyReplicas, -1) == 2
	}, waitLong, tick, "core CAPI counts 2 ready replicas")
}

func nodeReady(n corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
