package nodejoin_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crconfig "sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/nodejoin"
	"github.com/nstance-dev/nstance/internal/operator/workload"
	"github.com/nstance-dev/nstance/internal/server/agentapi"
	"github.com/nstance-dev/nstance/internal/server/app"
	"github.com/nstance-dev/nstance/internal/server/instances"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

const (
	clusterID = "jd-cluster"
	shardID   = "s1"
	tenant    = "default"
	group     = "web"
	timeout   = 3 * time.Second
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

// reportHealth stands in for the agents: every active instance of the
// shard reports every 100ms (the mock provider runs none).
func reportHealth(ctx context.Context, sh *shardtest.Shard) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		for _, r := range sh.Assembly.Instances.List(func(r *instances.Record) bool { return r.State.Active() }) {
			term := sh.Assembly.Term()
			if term == nil {
				break // not leading (yet)
			}
			_ = term.Agents.RecordHealth(ctx, agentapi.Ref{InstanceID: r.ID, Tenant: r.Tenant, Shard: r.Shard, Group: r.GroupID},
				&nstancev1.HealthReport{AgentVersion: "test"}, time.Now())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
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

func readyNode(name, providerID string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{ProviderID: providerID}}
}

func setReady(ctx context.Context, t *testing.T, c client.Client, n *corev1.Node) {
	t.Helper()
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	require.NoError(t, c.Status().Update(ctx, n))
}

func condition(conds []metav1.Condition, typ string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == typ {
			return &conds[i]
		}
	}
	return nil
}

// TestRunner runs the runner against a real API server and a real
// in-process shard: of a group of three, the instance whose Node is Ready
// in time stays; the member without a Node and without an NstanceMachine
// is replaced with NodeJoined=False on its pool, the one with an
// NstanceMachine with the condition there; an orphan Node gets one Event.
// The deadline is the pool's spec.joinTimeout, shorter than the runner's.
func TestRunner(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	sh := shardtest.Start(t, shardtest.Options{ClusterID: clusterID, ShardID: shardID, Log: logr.Discard(),
		Agent: app.Tuning{MonitorMock: true}})
	shard := sh.Client(t, tenant)
	go reportHealth(ctx, sh)

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "jd-"}}
	require.NoError(t, env.Client.Create(ctx, ns))
	require.NoError(t, env.Client.Create(ctx, &infrav1.NstanceMachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: group},
		// The pool's joinTimeout (3s) overrides the runner's hour.
		Spec: infrav1.NstanceMachinePoolSpec{Group: group, Shards: []string{shardID}, Template: "worker",
			JoinTimeout: &metav1.Duration{Duration: timeout}},
	}))
	_, err := shard.UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: group, Template: "worker", Size: 3}})
	require.NoError(t, err)

	// Three members with provider IDs; their Nodes are made before the
	// runner starts so that the kept one is Ready well within the timeout.
	var ids []string
	require.Eventually(t, func() bool {
		ids = ids[:0]
		for id, i := range members(ctx, t, shard) {
			if i.GetProviderId() == "" || i.GetState() != nstancev1.InstanceState_INSTANCE_STATE_RUNNING {
				return false
			}
			ids = append(ids, id)
		}
		return len(ids) == 3
	}, 30*time.Second, 50*time.Millisecond)
	slices.Sort(ids)
	all := members(ctx, t, shard)
	kept, lonely, mirrored := all[ids[0]], all[ids[1]], all[ids[2]]

	node := readyNode("kept", kept.GetProviderId())
	require.NoError(t, env.Client.Create(ctx, node))
	setReady(ctx, t, env.Client, node)
	orphan := readyNode("ghost", nodejoin.ProviderIDPrefix(clusterID)+shardID+"/ghost")
	require.NoError(t, env.Client.Create(ctx, orphan))
	setReady(ctx, t, env.Client, orphan)
	foreign := readyNode("foreign", "aws:///us-east-1a/i-0abc")
	require.NoError(t, env.Client.Create(ctx, foreign))
	t.Cleanup(func() {
		for _, n := range []*corev1.Node{node, orphan, foreign} {
			_ = env.Client.Delete(context.Background(), n)
		}
	})
	nm := &infrav1.NstanceMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: mirrored.GetInstanceId(),
			Annotations: map[string]string{infrav1.PoolInstanceAnnotation: mirrored.GetInstanceId()}},
		Spec: infrav1.NstanceMachineSpec{Group: group, Shard: shardID},
	}
	require.NoError(t, env.Client.Create(ctx, nm))

	scheme, err := kubetest.NewScheme()
	require.NoError(t, err)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: scheme, Logger: logr.Discard(), Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Cache:      cache.Options{DefaultNamespaces: map[string]cache.Config{ns.Name: {}}},
		Controller: crconfig.Controller{SkipNameValidation: new(true)},
	})
	require.NoError(t, err)
	wl, err := workload.NewLocal(ctx, mgr, env.Config)
	require.NoError(t, err)
	r := &nodejoin.Runner{
		Shards: directShards{shardID: shard}, Workload: wl, Cluster: client.ObjectKey{Namespace: ns.Name, Name: clusterID},
		ClusterID: clusterID, Client: mgr.GetClient(), Namespace: ns.Name, Recorder: mgr.GetEventRecorder("nstance-operator"),
		Timeout: time.Hour, Interval: 200 * time.Millisecond, Log: logr.Discard(),
	}
	require.NoError(t, mgr.Add(r))
	mctx, mcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() { mcancel(); <-done })

	// The member without an NstanceMachine: marked on the pool, replaced.
	require.Eventually(t, func() bool {
		var p infrav1.NstanceMachinePool
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: group}, &p); err != nil {
			return false
		}
		c := condition(p.Status.Conditions, nodejoin.ConditionNodeJoined)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == nodejoin.ReasonJoinTimeout
	}, 30*time.Second, 50*time.Millisecond, "pool NodeJoined=False")
	// The member with one: marked there.
	require.Eventually(t, func() bool {
		var m infrav1.NstanceMachine
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(nm), &m); err != nil {
			return false
		}
		c := condition(m.Status.Conditions, nodejoin.ConditionNodeJoined)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == nodejoin.ReasonJoinTimeout
	}, 30*time.Second, 50*time.Millisecond, "NstanceMachine NodeJoined=False")
	var m infrav1.NstanceMachine
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(nm), &m))
	msg := condition(m.Status.Conditions, nodejoin.ConditionNodeJoined).Message
	require.Contains(t, msg, mirrored.GetProviderId())
	require.Contains(t, msg, "join timeout 3s")

	// Both are replaced: gone or on their way out, and the group has new
	// members in their place.
	require.Eventually(t, func() bool {
		now := members(ctx, t, shard)
		for _, old := range []string{lonely.GetInstanceId(), mirrored.GetInstanceId()} {
			if i, ok := now[old]; ok {
				switch i.GetState() {
				case nstancev1.InstanceState_INSTANCE_STATE_DELETING, nstancev1.InstanceState_INSTANCE_STATE_DELETED:
				default:
					return false
				}
			}
		}
		fresh := 0
		for id, i := range now {
			if !slices.Contains(ids, id) && i.GetState() != nstancev1.InstanceState_INSTANCE_STATE_DELETED {
				fresh++
			}
		}
		return fresh >= 2
	}, 30*time.Second, 50*time.Millisecond, "late members replaced")

	// Events: on the pool and the NstanceMachine (events.k8s.io, the
	// operator's namespace), and on the orphan Node (core/v1, once).
	require.Eventually(t, func() bool {
		var list eventsv1.EventList
		if err := env.Client.List(ctx, &list, client.InNamespace(ns.Name)); err != nil {
			return false
		}
		seen := map[string]bool{}
		for _, e := range list.Items {
			if e.Reason == nodejoin.ReasonJoinTimeout && e.Type == corev1.EventTypeWarning {
				seen[e.Regarding.Kind+"/"+e.Regarding.Name] = true
			}
		}
		return seen["NstanceMachinePool/"+group] && seen["NstanceMachine/"+nm.Name]
	}, 30*time.Second, 50*time.Millisecond, "JoinTimeout Events")
	orphanEvents := func() []corev1.Event {
		var list corev1.EventList
		require.NoError(t, env.Client.List(ctx, &list))
		var out []corev1.Event
		for _, e := range list.Items {
			// This run's Nodes only: Events of an earlier run's Node of the
			// same name outlive it (go test -count=2).
			if e.Reason == nodejoin.ReasonUnknownProviderID && (e.InvolvedObject.UID == orphan.UID || e.InvolvedObject.UID == foreign.UID) {
				out = append(out, e)
			}
		}
		return out
	}
	require.Eventually(t, func() bool { return len(orphanEvents()) > 0 }, 30*time.Second, 50*time.Millisecond, "orphan Event")

	// The kept member: still running past its deadline, after the others
	// were replaced; it joined and its Node is known. The orphan was
	// reported once in all those passes, and the AWS Node never.
	first := kept.GetFirstHealthAt()
	if first == nil {
		first = members(ctx, t, shard)[kept.GetInstanceId()].GetFirstHealthAt()
	}
	require.NotNil(t, first)
	require.Eventually(t, func() bool { return time.Since(first.AsTime()) > timeout+time.Second }, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, nstancev1.InstanceState_INSTANCE_STATE_RUNNING, members(ctx, t, shard)[kept.GetInstanceId()].GetState())
	evs := orphanEvents()
	require.Len(t, evs, 1)
	require.Equal(t, "ghost", evs[0].InvolvedObject.Name)
	require.EqualValues(t, 1, evs[0].Count)
	require.Contains(t, evs[0].Message, orphan.Spec.ProviderID)
}
