package nodecarry_test

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/nodecarry"
	"github.com/nstance-dev/nstance/internal/operator/workload"
	"github.com/nstance-dev/nstance/internal/server/app"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

const (
	clusterID = "carry-cluster"
	shardID   = "s1"
	tenant    = "default"
	group     = "carry"
)

// directShards hands the runner a test shard's client, as shardconn would.
type directShards map[string]nstancev1.OperatorServiceClient

func (d directShards) ShardIDs() []string {
	ids := make([]string, 0, len(d))
	for id := range d {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (d directShards) Client(id string) (nstancev1.OperatorServiceClient, error) { return d[id], nil }

// apiServer is the in-cluster workload access over the test's API server
// client (uncached, so each pass sees the Nodes just written).
type apiServer struct{ c client.Client }

func (a apiServer) Cluster(context.Context, client.ObjectKey) (*workload.Cluster, error) {
	return &workload.Cluster{Client: a.c, Reader: a.c, Local: true}, nil
}

func (apiServer) Watch(client.ObjectKey, controller.Controller, string, client.Object, handler.EventHandler, ...predicate.Predicate) error {
	return nil
}

func (apiServer) Mode() workload.Mode { return workload.InCluster }

// clock is the runner's Now, moved by the test.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func members(ctx context.Context, t *testing.T, c nstancev1.OperatorServiceClient) map[string]*nstancev1.InstanceStatus {
	t.Helper()
	resp, err := c.ListInstances(ctx, &nstancev1.ListInstancesRequest{GroupIds: []string{group}})
	require.NoError(t, err)
	out := map[string]*nstancev1.InstanceStatus{}
	for _, i := range resp.GetInstances() {
		out[i.GetInstanceId()] = i
	}
	return out
}

// waitNew waits for a running member with a provider ID that is not in
// known, and returns it.
func waitNew(ctx context.Context, t *testing.T, c nstancev1.OperatorServiceClient, known map[string]bool) *nstancev1.InstanceStatus {
	t.Helper()
	var found *nstancev1.InstanceStatus
	require.Eventually(t, func() bool {
		for id, i := range members(ctx, t, c) {
			if !known[id] && i.GetProviderId() != "" && i.GetState() == nstancev1.InstanceState_INSTANCE_STATE_RUNNING {
				found = i
				return true
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond, "a new member")
	return found
}

func makeNode(ctx context.Context, t *testing.T, c client.Client, name string, i *nstancev1.InstanceStatus, labels map[string]string, taints ...corev1.Taint) *corev1.Node {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.NodeSpec{ProviderID: i.GetProviderId(), Taints: taints}}
	require.NoError(t, c.Create(ctx, n))
	t.Cleanup(func() { _ = c.Delete(context.Background(), n) })
	return n
}

func getNode(ctx context.Context, t *testing.T, c client.Client, name string) *corev1.Node {
	t.Helper()
	var n corev1.Node
	require.NoError(t, c.Get(ctx, client.ObjectKey{Name: name}, &n))
	return &n
}

// TestCarryToReplacement runs the runner's passes against a real API server
// and a real in-process shard. A member whose Node a user labelled and
// tainted is deleted; the group replaces it, and the replacement's Node
// receives the label and taint (not the key no prefix selects), while the
// other member's Node gets nothing. A scaled-down member's labels go with it:
// the member the group later grows by gets nothing.
func TestCarryToReplacement(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	sh := shardtest.Start(t, shardtest.Options{ClusterID: clusterID, ShardID: shardID, Log: logr.Discard(),
		Agent: app.Tuning{MonitorMock: true}})
	shard := sh.Client(t, tenant)

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "carry-"}}
	require.NoError(t, env.Client.Create(ctx, ns))
	pool := &infrav1.NstanceMachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: group},
		Spec:       infrav1.NstanceMachinePoolSpec{Group: group, Shards: []string{shardID}, Template: "worker"},
	}
	require.NoError(t, env.Client.Create(ctx, pool))
	_, err := shard.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: group, Template: "worker", Size: 1}})
	require.NoError(t, err)
	known := map[string]bool{}
	first := waitNew(ctx, t, shard, known)
	known[first.GetInstanceId()] = true
	// The unrelated member comes later than the labelled one, so it is
	// newer and could be mistaken for its successor.
	_, err = shard.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: group, Template: "worker", Size: 2}})
	require.NoError(t, err)
	other := waitNew(ctx, t, shard, known)
	known[other.GetInstanceId()] = true

	gpu := corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}
	sfx := ns.Name // Node names unique per run (go test -count=2)
	makeNode(ctx, t, env.Client, "labelled-"+sfx, first, map[string]string{"example.com/team": "x", "unselected.io/x": "y"}, gpu)
	makeNode(ctx, t, env.Client, "other-"+sfx, other, nil)

	clk := &clock{t: time.Now()}
	r := &nodecarry.Runner{
		Shards: directShards{shardID: shard}, Workload: apiServer{env.Client}, Cluster: client.ObjectKey{Namespace: ns.Name, Name: clusterID},
		Client: env.Client, Namespace: ns.Name, Log: logr.Discard(), Now: clk.Now,
		Policy: nodecarry.Policy{LabelPrefixes: []string{"example.com/"}, TaintPrefixes: []string{"dedicated"},
			Settle: nodecarry.DefaultSettle, Window: nodecarry.DefaultWindow, TTL: nodecarry.DefaultTTL, Max: nodecarry.DefaultMax},
	}
	require.NoError(t, r.Pass(ctx))
	require.NotContains(t, getPool(ctx, t, pool).Annotations, nodecarry.StateAnnotation, "nothing departed")

	// Delete the labelled member (as nodejoin or a deleted Machine would):
	// the group replaces it, the pass records its Node's keys.
	_, err = shard.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: first.GetInstanceId()})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return members(ctx, t, shard)[first.GetInstanceId()].GetReplaced() }, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, r.Pass(ctx))
	require.Contains(t, getPool(ctx, t, pool).Annotations[nodecarry.StateAnnotation], `"example.com/team":"x"`)

	repl := waitNew(ctx, t, shard, known)
	known[repl.GetInstanceId()] = true
	makeNode(ctx, t, env.Client, "replacement-"+sfx, repl, map[string]string{"own.io/x": "z"})
	clk.Add(nodecarry.DefaultSettle)
	require.NoError(t, r.Pass(ctx))

	n := getNode(ctx, t, env.Client, "replacement-"+sfx)
	require.Equal(t, "x", n.Labels["example.com/team"])
	require.Equal(t, "z", n.Labels["own.io/x"])
	require.NotContains(t, n.Labels, "unselected.io/x")
	require.Equal(t, []corev1.Taint{gpu}, dedicated(n), "the carried taint, once")
	require.Equal(t, shardID+"/"+first.GetInstanceId(), n.Annotations[nodecarry.CarriedFromAnnotation])
	o := getNode(ctx, t, env.Client, "other-"+sfx)
	require.NotContains(t, o.Labels, "example.com/team")
	require.Empty(t, dedicated(o))
	require.NotContains(t, getPool(ctx, t, pool).Annotations, nodecarry.StateAnnotation, "the entry went with its successor")

	// Scale-down: the victim (the replacement, labelled now) is not
	// replaced, so the member the group grows by afterwards gets nothing.
	_, err = shard.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: repl.GetInstanceId(), OnScaleDown: true})
	require.NoError(t, err)
	_, err = shard.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: group, Template: "worker", Size: 1}})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		switch members(ctx, t, shard)[repl.GetInstanceId()].GetState() {
		case nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION, nstancev1.InstanceState_INSTANCE_STATE_DELETING,
			nstancev1.InstanceState_INSTANCE_STATE_DELETED, nstancev1.InstanceState_INSTANCE_STATE_UNSPECIFIED:
			return true
		}
		return false
	}, 30*time.Second, 50*time.Millisecond, "scale-down victim departing")
	require.False(t, members(ctx, t, shard)[repl.GetInstanceId()].GetReplaced())
	require.NoError(t, r.Pass(ctx))
	require.NotContains(t, getPool(ctx, t, pool).Annotations, nodecarry.StateAnnotation, "a scaled-down member leaves no entry")
	_, err = shard.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: group, Template: "worker", Size: 2}})
	require.NoError(t, err)
	grown := waitNew(ctx, t, shard, known)
	makeNode(ctx, t, env.Client, "grown-"+sfx, grown, nil)
	clk.Add(nodecarry.DefaultSettle)
	require.NoError(t, r.Pass(ctx))
	g := getNode(ctx, t, env.Client, "grown-"+sfx)
	require.NotContains(t, g.Labels, "example.com/team")
	require.Empty(t, dedicated(g))
	require.NotContains(t, g.Annotations, nodecarry.CarriedFromAnnotation)
}

// dedicated returns the Node's taints with the carried key (the API server
// adds node.kubernetes.io/not-ready to every new Node).
func dedicated(n *corev1.Node) []corev1.Taint {
	var out []corev1.Taint
	for _, t := range n.Spec.Taints {
		if t.Key == "dedicated" {
			out = append(out, corev1.Taint{Key: t.Key, Value: t.Value, Effect: t.Effect})
		}
	}
	return out
}

func getPool(ctx context.Context, t *testing.T, p *infrav1.NstanceMachinePool) *infrav1.NstanceMachinePool {
	t.Helper()
	var out infrav1.NstanceMachinePool
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(p), &out))
	return &out
}

// TestCarryOnRotation: the template's instance type changes on the server,
// so the group rotates its member: the surge member is created (and gets its
// Node) before the old one is drained, and still takes the old Node's label
// and taint.
func TestCarryOnRotation(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// Without agent monitoring (the mock provider runs no agents) a running
	// member counts as ready, so the rotation goes on by itself.
	sh := shardtest.Start(t, shardtest.Options{ClusterID: clusterID, ShardID: shardID, Log: logr.Discard()})
	shard := sh.Client(t, tenant)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "carry-rot-"}}
	require.NoError(t, env.Client.Create(ctx, ns))
	pool := &infrav1.NstanceMachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: group},
		Spec:       infrav1.NstanceMachinePoolSpec{Group: group, Shards: []string{shardID}, Template: "worker"},
	}
	require.NoError(t, env.Client.Create(ctx, pool))
	_, err := shard.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: group, Template: "worker", Size: 1}})
	require.NoError(t, err)
	known := map[string]bool{}
	old := waitNew(ctx, t, shard, known)
	known[old.GetInstanceId()] = true
	gpu := corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}
	sfx := ns.Name
	makeNode(ctx, t, env.Client, "old-"+sfx, old, map[string]string{"example.com/team": "x"}, gpu)

	clk := &clock{t: time.Now()}
	r := &nodecarry.Runner{
		Shards: directShards{shardID: shard}, Workload: apiServer{env.Client}, Cluster: client.ObjectKey{Namespace: ns.Name, Name: clusterID},
		Client: env.Client, Namespace: ns.Name, Log: logr.Discard(), Now: clk.Now,
		Policy: nodecarry.Policy{LabelPrefixes: []string{"example.com/"}, TaintPrefixes: []string{"dedicated"},
			Settle: nodecarry.DefaultSettle, Window: nodecarry.DefaultWindow, TTL: nodecarry.DefaultTTL, Max: nodecarry.DefaultMax},
	}

	cur := sh.Config.Current()
	next := *cur
	next.Templates = maps.Clone(cur.Templates)
	w := next.Templates["worker"]
	w.InstanceType = "test.large"
	next.Templates["worker"] = w
	sh.Config.Set(&next, "rotate", time.Now())

	// The surge member joins as a Node of its own, then the old member is
	// drained for the rotation.
	surge := waitNew(ctx, t, shard, known)
	makeNode(ctx, t, env.Client, "surge-"+sfx, surge, nil)
	require.Eventually(t, func() bool {
		i := members(ctx, t, shard)[old.GetInstanceId()]
		return i.GetState() == nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION && i.GetReplaced()
	}, 30*time.Second, 50*time.Millisecond, "old member rotated out")
	require.NoError(t, r.Pass(ctx))
	clk.Add(nodecarry.DefaultSettle)
	require.NoError(t, r.Pass(ctx))

	n := getNode(ctx, t, env.Client, "surge-"+sfx)
	require.Equal(t, "x", n.Labels["example.com/team"])
	require.Equal(t, []corev1.Taint{gpu}, dedicated(n))
	require.Equal(t, shardID+"/"+old.GetInstanceId(), n.Annotations[nodecarry.CarriedFromAnnotation])
}

// loopStreams reopens a stream until ctx ends, as shardconn's Follow does.
type loopStreams struct{}

func (loopStreams) Follow(ctx context.Context, _, _ string, _ time.Duration, _ logr.Logger, _ func(), follow func(context.Context) error) {
	for ctx.Err() == nil {
		_ = follow(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// TestCarryFromStream: a replaced member whose instance is gone before any
// pass lists it departing (its Node had nothing to drain) is still carried:
// the runner read its Node when the stream announced the deletion.
func TestCarryFromStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	sh := shardtest.Start(t, shardtest.Options{ClusterID: clusterID, ShardID: shardID, Log: logr.Discard()})
	shard := sh.Client(t, tenant)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "carry-stream-"}}
	require.NoError(t, env.Client.Create(ctx, ns))
	pool := &infrav1.NstanceMachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: group},
		Spec:       infrav1.NstanceMachinePoolSpec{Group: group, Shards: []string{shardID}, Template: "worker"},
	}
	require.NoError(t, env.Client.Create(ctx, pool))
	_, err := shard.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: group, Template: "worker", Size: 1}})
	require.NoError(t, err)
	known := map[string]bool{}
	old := waitNew(ctx, t, shard, known)
	known[old.GetInstanceId()] = true
	gpu := corev1.Taint{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}
	sfx := ns.Name
	makeNode(ctx, t, env.Client, "old-"+sfx, old, map[string]string{"example.com/team": "x"}, gpu)

	clk := &clock{t: time.Now()}
	r := &nodecarry.Runner{
		Shards: directShards{shardID: shard}, Streams: loopStreams{}, Workload: apiServer{env.Client},
		Cluster: client.ObjectKey{Namespace: ns.Name, Name: clusterID}, Client: env.Client, Namespace: ns.Name, Log: logr.Discard(), Now: clk.Now,
		Policy: nodecarry.Policy{LabelPrefixes: []string{"example.com/"}, TaintPrefixes: []string{"dedicated"},
			Settle: nodecarry.DefaultSettle, Window: nodecarry.DefaultWindow, TTL: nodecarry.DefaultTTL, Max: nodecarry.DefaultMax},
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	r.Watch(wctx)

	// Deleted (the server re-announces a pending drain to a stream that
	// opens later, so the order does not matter), seen on the stream, then
	// drained and gone before any pass.
	_, err = shard.DeleteInstance(ctx, &nstancev1.DeleteInstanceRequest{InstanceId: old.GetInstanceId()})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return r.Departures() == 1 }, 30*time.Second, 50*time.Millisecond, "departure seen on the stream")
	_, err = shard.AcknowledgeDrained(ctx, &nstancev1.AcknowledgeDrainedRequest{InstanceId: old.GetInstanceId()})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		_, listed := members(ctx, t, shard)[old.GetInstanceId()]
		return !listed
	}, 30*time.Second, 50*time.Millisecond, "old instance gone")

	repl := waitNew(ctx, t, shard, known)
	makeNode(ctx, t, env.Client, "new-"+sfx, repl, nil)
	require.NoError(t, r.Pass(ctx))
	require.Zero(t, r.Departures(), "stored on the pool")
	require.Contains(t, getPool(ctx, t, pool).Annotations[nodecarry.StateAnnotation], `"example.com/team":"x"`)
	clk.Add(nodecarry.DefaultSettle)
	require.NoError(t, r.Pass(ctx))
	n := getNode(ctx, t, env.Client, "new-"+sfx)
	require.Equal(t, "x", n.Labels["example.com/team"])
	require.Equal(t, []corev1.Taint{gpu}, dedicated(n))
}
