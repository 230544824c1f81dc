package capicontract_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cpv1 "github.com/nstance-dev/nstance/api/controlplane/v1beta1"
	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/abandon"
	opconfig "github.com/nstance-dev/nstance/internal/operator/config"
	"github.com/nstance-dev/nstance/internal/operator/ledger"
	"github.com/nstance-dev/nstance/internal/operator/shardgroup"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// shardDowntime is how long the second shard's server stays down in the
// middle of the Cluster's deletion. No product timing depends on it: the
// operator retries an unreachable shard every RetryDelay and the
// NstanceCluster looks again every 2 s, whatever the outage lasts.
const shardDowntime = 30 * time.Second

// restartShard starts a stopped shard's server again on its store,
// provider and Operator address, as a restarted nstance-server.
func restartShard(t *testing.T, f *fixture, old *shardtest.Shard) *shardtest.Shard {
	t.Helper()
	return shardtest.Start(t, shardtest.Options{ClusterID: clusterID, ShardID: old.ShardID, CA: f.ca, Store: old.Store,
		Provider: old.Provider, OperatorAddr: old.OperatorAddr, Log: logr.Discard()})
}

// shardClients keeps one Operator client per running shard server: a new
// connection per poll would run into the server's connections-per-source
// limit.
type shardClients map[*shardtest.Shard]nstancev1.OperatorServiceClient

// members lists the instances of group on sh that still count (any state
// but deleted or failed); ok is false while the shard cannot be asked.
func (c shardClients) members(t *testing.T, sh *shardtest.Shard, group string) (ids []string, ok bool) {
	t.Helper()
	cl, found := c[sh]
	if !found {
		cl = sh.Client(t, tenant)
		c[sh] = cl
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cl.ListInstances(ctx, &nstancev1.ListInstancesRequest{GroupIds: []string{group}})
	if err != nil {
		t.Logf("ListInstances on %s: %v", sh.ShardID, err)
		return nil, false
	}
	return shardgroup.Remaining(resp.GetInstances()), true
}

// bootingProvider is the Node-registering mock whose instances created
// after hold stay pending (a VM still booting: no Node yet), as a surge
// instance does until it is ready: the rotation then keeps the old member
// beside it.
type bootingProvider struct {
	*nodeProvider
	mu      sync.Mutex
	hold    bool
	booting map[string]bool
}

func newBootingProvider() *bootingProvider {
	return &bootingProvider{nodeProvider: &nodeProvider{Provider: mock.New(), c: env.Client}, booting: map[string]bool{}}
}

func (p *bootingProvider) holdNew() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hold = true
}

func (p *bootingProvider) pending(inst provider.Instance) provider.Instance {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.booting[inst.InstanceID] {
		inst.State = provider.StatePending
	}
	return inst
}

func (p *bootingProvider) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	p.mu.Lock()
	hold := p.hold
	p.mu.Unlock()
	if !hold {
		return p.nodeProvider.Create(ctx, req)
	}
	inst, err := p.nodeProvider.Provider.Create(ctx, req)
	if err != nil {
		return inst, err
	}
	p.mu.Lock()
	p.booting[req.InstanceID] = true
	p.mu.Unlock()
	return p.pending(inst), nil
}

func (p *bootingProvider) Status(ctx context.Context, id string) (provider.Instance, error) {
	inst, err := p.nodeProvider.Status(ctx, id)
	return p.pending(inst), err
}

func (p *bootingProvider) List(ctx context.Context) ([]provider.Instance, error) {
	list, err := p.nodeProvider.List(ctx)
	for i := range list {
		list[i] = p.pending(list[i])
	}
	return list, err
}

// deletionFixture runs core CAPI and the operator over two shards with a
// pool of one replica per shard, then rolls the pool onto new bootstrap
// data: the shard holding the rollout's surge budget creates a surge
// instance, which stays pending (still booting), so the old member stays
// beside it. It returns the shards and
// every instance of the group by shard, surge ones included.
func deletionFixture(t *testing.T, pool string, clients shardClients) (*fixture, map[string]*shardtest.Shard, map[string][]string) {
	t.Helper()
	ctx := context.Background()
	provs := map[string]*bootingProvider{shardID: newBootingProvider(), shardB: newBootingProvider()}
	f := newFixtureWith(t, env.Client, func(o *shardtest.Options) { o.Provider = provs[shardID] })
	shB := shardtest.Start(t, shardtest.Options{ClusterID: clusterID, ShardID: shardB, CA: f.ca, Provider: provs[shardB], Log: logr.Discard()})
	f.opts.Config.Shards[shardB] = opconfig.Shard{RegistrationAddr: f.opts.Config.Shards[shardID].RegistrationAddr, OperatorAddr: shB.OperatorAddr}
	shards := map[string]*shardtest.Shard{shardID: f.shard, shardB: shB}
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
	f.createPoolOn(t, pool, 2, 5*time.Second, shardID, shardB)
	// waitMembers waits for want members in all, at least one per shard.
	waitMembers := func(want int, why string) map[string][]string {
		t.Helper()
		got := map[string][]string{}
		require.Eventually(t, func() bool {
			n := 0
			for id, sh := range shards {
				ids, ok := clients.members(t, sh, pool)
				if !ok || len(ids) == 0 {
					return false
				}
				got[id] = ids
				n += len(ids)
			}
			return n == want
		}, waitLong, tick, why)
		return got
	}
	before := waitMembers(2, "one member per shard")

	// The rollout: new bootstrap data, as a bootstrap provider writes.
	for _, p := range provs {
		p.holdNew()
	}
	require.NoError(t, env.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: bootstrapSecret + "-v2"},
		Type:       clusterv1.ClusterSecretType,
		Data:       map[string][]byte{"value": []byte("#cloud-config\n# v2\n"), "format": []byte("cloud-config")},
	}))
	var mp clusterv1.MachinePool
	require.True(t, get(t, client.ObjectKey{Namespace: f.ns, Name: pool}, &mp))
	p := client.MergeFrom(mp.DeepCopy())
	mp.Spec.Template.Spec.Bootstrap.DataSecretName = ptr.To(bootstrapSecret + "-v2")
	require.NoError(t, env.Client.Patch(ctx, &mp, p))
	// The pool's surge budget (1) goes to one shard at a time; the other
	// waits, paused.
	all := waitMembers(3, "a surge instance on one shard")
	for id := range shards {
		require.Contains(t, all[id], before[id][0], "the old member stays on %s", id)
		// What the operator last saw of the group (the abandon Event names it).
		require.Eventually(t, func() bool {
			var sg infrav1.NstanceShardGroup
			return get(t, client.ObjectKey{Namespace: f.ns, Name: infrav1.ShardGroupName(pool, id)}, &sg) && len(sg.Status.ProviderIDs) == len(all[id])
		}, waitLong, tick, "shard group on %s sees its members", id)
	}
	t.Logf("instances before deletion: %v", all)
	return f, shards, all
}

// clusterObjectsLeft names the Cluster API and Nstance objects left in ns.
func clusterObjectsLeft(t *testing.T, ns string) []string {
	t.Helper()
	var out []string
	for _, l := range []client.ObjectList{&clusterv1.ClusterList{}, &clusterv1.MachinePoolList{}, &clusterv1.MachineList{},
		&infrav1.NstanceClusterList{}, &cpv1.NstanceControlPlaneList{}, &infrav1.NstanceMachinePoolList{},
		&infrav1.NstanceShardGroupList{}, &infrav1.NstanceMachineList{}} {
		require.NoError(t, env.Client.List(context.Background(), l, client.InNamespace(ns)))
		items, err := apimeta.ExtractList(l)
		require.NoError(t, err)
		for _, o := range items {
			obj := o.(client.Object)
			desc := fmt.Sprintf("%T/%s", o, obj.GetName())
			if g, ok := o.(conditions.Getter); ok {
				if c := conditions.Get(g, infrav1.ReadyCondition); c != nil && c.Status != metav1.ConditionTrue {
					desc += fmt.Sprintf(" (%s: %s)", c.Reason, c.Message)
				}
			}
			out = append(out, desc)
		}
	}
	return out
}

// surgeShard returns the shard running the surge instance (the one to take
// down) and the other.
func surgeShard(all map[string][]string) (down, up string) {
	if len(all[shardB]) > len(all[shardID]) {
		return shardB, shardID
	}
	return shardID, shardB
}

func deleteCluster(t *testing.T, ns string) {
	t.Helper()
	cl := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: clusterID}}
	require.NoError(t, env.Client.Delete(context.Background(), cl))
}

// TestClusterDeletionSurvivesShardOutage: the Cluster is deleted while the
// server of the shard running the surge instance is down for shardDowntime. Deletion waits for
// it (nothing is released while instances may still run there), and once
// the server is back every instance of the pool, the surge ones included,
// is gone on both shards, no Cluster API or Nstance object is left, every
// finalizer was released, and nothing is recorded as orphaned.
func TestClusterDeletionSurvivesShardOutage(t *testing.T) {
	const pool = "del"
	clients := shardClients{}
	f, shards, all := deletionFixture(t, pool, clients)
	down, up := surgeShard(all)

	deleteCluster(t, f.ns)
	shards[down].Stop()
	downSince := time.Now()
	// The outage is seen where deletion waits on it: shard B's shard group
	// (or, once everything else is gone, the NstanceCluster) says so.
	require.Eventually(t, func() bool {
		var sg infrav1.NstanceShardGroup
		if get(t, client.ObjectKey{Namespace: f.ns, Name: infrav1.ShardGroupName(pool, down)}, &sg) && conditions.IsFalse(&sg, infrav1.ShardReachableCondition) {
			return true
		}
		var nc infrav1.NstanceCluster
		return get(t, client.ObjectKey{Namespace: f.ns, Name: clusterID}, &nc) &&
			conditions.GetReason(&nc, infrav1.ReadyCondition) == "WaitingForShard"
	}, waitLong, tick, "deletion reports the unreachable shard")
	// Shard A is cleaned meanwhile.
	require.Eventually(t, func() bool {
		ids, ok := clients.members(t, shards[up], pool)
		return ok && len(ids) == 0
	}, waitLong, tick, "every instance on the reachable shard goes during the outage")
	time.Sleep(time.Until(downSince.Add(shardDowntime)))
	var cl clusterv1.Cluster
	require.True(t, get(t, client.ObjectKey{Namespace: f.ns, Name: clusterID}, &cl), "the Cluster waits for the unreachable shard")
	var nc infrav1.NstanceCluster
	if get(t, client.ObjectKey{Namespace: f.ns, Name: clusterID}, &nc) {
		require.Contains(t, nc.Finalizers, infrav1.ClusterFinalizer)
	}
	sgB := infrav1.NstanceShardGroup{}
	require.True(t, get(t, client.ObjectKey{Namespace: f.ns, Name: infrav1.ShardGroupName(pool, down)}, &sgB),
		"shard B's shard group keeps its finalizer while the server is down")

	shards[down] = restartShard(t, f, shards[down])
	require.Eventually(t, func() bool {
		left := clusterObjectsLeft(t, f.ns)
		if len(left) > 0 {
			t.Logf("left: %v", left)
		}
		return len(left) == 0
	}, 3*waitLong, time.Second, "every object of the Cluster goes once the shard is back")
	for id, sh := range shards {
		ids, ok := clients.members(t, sh, pool)
		require.True(t, ok)
		require.Empty(t, ids, "no instance of the pool left on %s", id)
		for _, iid := range all[id] {
			require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_DELETED, instanceState(t, sh, iid), "instance %s on %s", iid, id)
		}
	}
	require.NotEmpty(t, events(t, f.ns, "NstanceCluster", clusterID, "InstancesDeleted"))
	require.Empty(t, events(t, f.ns, "NstanceCluster", clusterID, abandon.EventReason), "nothing abandoned")
	entries, err := ledger.New(env.Client, f.ns, "").Load(context.Background(), env.Client)
	require.NoError(t, err)
	require.Empty(t, ledger.Orphans(entries))
}

// TestClusterDeletionAbandonsUnreachableShard: with the abandon annotation
// on the Cluster and the server of the shard running the surge instance
// kept down, the Cluster's deletion finishes: the other shard is cleaned as
// usual; the down shard's shard group, machines and the NstanceCluster
// release their finalizers with Events naming the group and every instance
// left there. When the server is back, the operator deletes the orphaned
// group there.
func TestClusterDeletionAbandonsUnreachableShard(t *testing.T) {
	const pool = "abandon"
	ctx := context.Background()
	clients := shardClients{}
	f, shards, all := deletionFixture(t, pool, clients)
	down, up := surgeShard(all)

	var cl clusterv1.Cluster
	require.True(t, get(t, client.ObjectKey{Namespace: f.ns, Name: clusterID}, &cl))
	p := client.MergeFrom(cl.DeepCopy())
	cl.Annotations = map[string]string{infrav1.AbandonInstancesAnnotation: "true"}
	require.NoError(t, env.Client.Patch(ctx, &cl, p))
	shards[down].Stop()
	deleteCluster(t, f.ns)
	require.Eventually(t, func() bool {
		left := clusterObjectsLeft(t, f.ns)
		if len(left) > 0 {
			t.Logf("left: %v", left)
		}
		return len(left) == 0
	}, 3*waitLong, time.Second, "deletion finishes with shard B down")
	ids, ok := clients.members(t, shards[up], pool)
	require.True(t, ok)
	require.Empty(t, ids, "the reachable shard is cleaned as usual")

	sgEvents := events(t, f.ns, "NstanceShardGroup", infrav1.ShardGroupName(pool, down), abandon.EventReason)
	require.NotEmpty(t, sgEvents)
	msg := sgEvents[0].Message
	require.Contains(t, msg, "group "+pool+" abandoned on shard "+down)
	ncEvents := events(t, f.ns, "NstanceCluster", clusterID, abandon.EventReason)
	require.NotEmpty(t, ncEvents)
	require.Contains(t, ncEvents[0].Message, "shard "+down)
	require.Contains(t, ncEvents[0].Message, "["+pool+"]")
	require.Empty(t, events(t, f.ns, "NstanceShardGroup", infrav1.ShardGroupName(pool, up), abandon.EventReason), "nothing abandoned on the reachable shard")
	// Every instance of shard B is named, by the shard group (provider IDs
	// it last saw) or by the NstanceMachine that stood for it.
	var named []string
	var list corev1.EventList
	require.NoError(t, env.Client.List(ctx, &list, client.InNamespace(f.ns)))
	for _, e := range list.Items {
		if e.Reason == abandon.EventReason {
			named = append(named, e.Message)
		}
	}
	for _, iid := range all[down] {
		require.Truef(t, strings.Contains(strings.Join(named, "\n"), iid), "instance %s on shard B is named in an Event: %v", iid, named)
	}
	entries, err := ledger.New(env.Client, f.ns, "").Load(ctx, env.Client)
	require.NoError(t, err)
	require.Equal(t, []ledger.Orphan{{Group: pool, Shard: down}}, ledger.Orphans(entries))

	// Back: the operator deletes the orphaned group and forgets it.
	shards[down] = restartShard(t, f, shards[down])
	require.Eventually(t, func() bool {
		ids, ok := clients.members(t, shards[down], pool)
		if !ok || len(ids) > 0 {
			return false
		}
		entries, err := ledger.New(env.Client, f.ns, "").Load(ctx, env.Client)
		require.NoError(t, err)
		return len(ledger.Orphans(entries)) == 0
	}, waitLong, tick, "the orphaned group is deleted on shard B once it is back")
}
