package manager_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/yaml"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/drain"
	"github.com/nstance-dev/nstance/internal/operator/manager"
)

// TestGeneratedRBACSuffices runs the operator as a ServiceAccount bound only
// to the ClusterRole generated from the RBAC markers (config/rbac), through
// registration, leader election, a pool's lifecycle, Events and the
// kubeconfig Secret. A verb missing from the markers makes it fail.
func TestGeneratedRBACSuffices(t *testing.T) {
	ctx := context.Background()
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "config", "rbac", "role.yaml"))
	require.NoError(t, err, "run make generate-k8s")
	var role rbacv1.ClusterRole
	var nsRole rbacv1.Role
	for doc := range strings.SplitSeq(string(data), "\n---\n") {
		var meta metav1.TypeMeta
		require.NoError(t, yaml.Unmarshal([]byte(doc), &meta))
		switch meta.Kind {
		case "ClusterRole":
			require.NoError(t, yaml.Unmarshal([]byte(doc), &role))
		case "Role":
			require.NoError(t, yaml.Unmarshal([]byte(doc), &nsRole))
		}
	}
	require.Equal(t, "nstance-operator", role.Name)
	require.Equal(t, manager.RoleNamespace, nsRole.Namespace)
	require.NotEmpty(t, nsRole.Rules, "Secrets and tokens come from the namespaced Role")

	f := newFixture(t, "shard-a", "shard-b")
	f.putNonce(t)
	role.Name = "nstance-operator-" + f.ns
	require.NoError(t, env.Client.Create(ctx, &role))
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), &role) })
	// Bound cluster-wide as the chart does: Nodes are cluster-scoped, and
	// drains list and evict pods of every namespace.
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: f.ns, Name: "nstance-operator"}},
	}
	require.NoError(t, env.Client.Create(ctx, binding))
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), binding) })
	// The namespaced rules (Secrets, ServiceAccount tokens) are bound only
	// in the operator's namespace, as the chart does.
	nsRole.ObjectMeta = metav1.ObjectMeta{Namespace: f.ns, Name: "nstance-operator"}
	require.NoError(t, env.Client.Create(ctx, &nsRole))
	require.NoError(t, env.Client.Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "nstance-operator"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: nsRole.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: f.ns, Name: "nstance-operator"}},
	}))

	o := f.options(t)
	o.LeaderElect = true
	o.DrainRetryInterval = 100 * time.Millisecond
	cfg := rest.CopyConfig(env.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + f.ns + ":nstance-operator",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + f.ns, "system:authenticated"},
	}
	o.RestConfig = cfg
	r := startOperator(t, o)
	r.waitImported(t)

	// A drain under these rules: the DaemonSet lookup is allowed, so the
	// DaemonSet's pod is left alone and the drain finishes, well before its
	// deadline, rather than failing until the deadline passes.
	inst := onDemand(t, f.shards["shard-a"], time.Minute)
	node := "node-" + inst.GetInstanceId()
	createNode(t, env.Client, node, inst.GetProviderId())
	r.waitNodeCached(t, inst.GetProviderId())
	createPod(t, env.Client, f.ns, "rbac-app", node, plainPod, nil)
	createPod(t, env.Client, f.ns, "rbac-ds", node, daemonSetPod, nil)
	deleteInstance(t, f.shards["shard-a"], inst.GetInstanceId())
	require.Eventually(t, func() bool { return len(nodeEvents(t, env.Client, node, drain.ReasonDrained)) > 0 }, waitLong, tick)
	require.Empty(t, nodeEvents(t, env.Client, node, drain.ReasonEvictionFailed), "no DaemonSet lookup failed")
	require.False(t, podExists(t, env.Client, f.ns, "rbac-app"))
	require.True(t, podExists(t, env.Client, f.ns, "rbac-ds"))

	f.createPool(t, "rbac", 3, "shard-a", "shard-b")
	require.Eventually(t, func() bool {
		p, _ := get(t, f.ns, "rbac", &infrav1.NstanceMachinePool{})
		return p.Status.Ready && len(p.Spec.ProviderIDList) == 3
	}, waitLong, tick)
	require.Eventually(t, func() bool {
		_, ok := get(t, f.ns, clusterID+"-kubeconfig", &corev1.Secret{})
		return ok
	}, waitLong, tick)
	p, _ := get(t, f.ns, "rbac", &infrav1.NstanceMachinePool{})
	require.NoError(t, env.Client.Delete(ctx, p))
	require.NoError(t, env.Client.Delete(ctx, &clusterv1.MachinePool{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "rbac"}}))
	require.Eventually(t, func() bool {
		_, ok := get(t, f.ns, "rbac", &infrav1.NstanceMachinePool{})
		return !ok
	}, waitLong, tick)
	require.Eventually(t, func() bool {
		return len(f.events(t, "NstanceShardGroup", "rbac--shard-a", "GroupDeleted")) > 0
	}, waitLong, tick, "Events are written")
}
