package capicontract_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	opconfig "github.com/nstance-dev/nstance/internal/operator/config"
	"github.com/nstance-dev/nstance/internal/operator/machinepool"
	"github.com/nstance-dev/nstance/internal/operator/rollguard"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/mock"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// gatedProvider is the Node-registering mock provider whose new instances
// stay pending (not ready) while hold is on, until release: a rollout step
// can then be caught in flight.
type gatedProvider struct {
	*nodeProvider
	hold atomic.Bool
	mu   sync.Mutex
	held map[string]bool
}

func newGatedProvider() *gatedProvider {
	return &gatedProvider{nodeProvider: &nodeProvider{Provider: mock.New(), c: env.Client}, held: map[string]bool{}}
}

func (p *gatedProvider) Create(ctx context.Context, req provider.CreateRequest) (provider.Instance, error) {
	inst, err := p.nodeProvider.Create(ctx, req)
	if err == nil && p.hold.Load() {
		p.mu.Lock()
		p.held[inst.InstanceID] = true
		p.mu.Unlock()
		inst.State = provider.StatePending
	}
	return inst, err
}

func (p *gatedProvider) gate(inst provider.Instance) provider.Instance {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held[inst.InstanceID] {
		inst.State = provider.StatePending
	}
	return inst
}

func (p *gatedProvider) Status(ctx context.Context, id string) (provider.Instance, error) {
	inst, err := p.nodeProvider.Status(ctx, id)
	return p.gate(inst), err
}

func (p *gatedProvider) List(ctx context.Context) ([]provider.Instance, error) {
	insts, err := p.nodeProvider.List(ctx)
	for i := range insts {
		insts[i] = p.gate(insts[i])
	}
	return insts, err
}

// release lets every held instance run.
func (p *gatedProvider) release() {
	p.hold.Store(false)
	p.mu.Lock()
	clear(p.held)
	p.mu.Unlock()
}

// rolloutSampler polls both shards and the pool while a rollout runs and
// keeps what the acceptance line bounds: the most active instances and the
// fewest ready ones pool-wide, the pool's upToDateReplicas as it changes and
// every RollingOut message.
type rolloutSampler struct {
	mu                sync.Mutex
	maxActive         int
	minReady          int
	upToDate          []int32
	messages          map[string]bool
	samples, failures int
	stop              chan struct{}
	done              chan struct{}
}

func activeState(s nstancev1.InstanceState) bool {
	switch s {
	case nstancev1.InstanceState_INSTANCE_STATE_PENDING, nstancev1.InstanceState_INSTANCE_STATE_CREATING,
		nstancev1.InstanceState_INSTANCE_STATE_RUNNING, nstancev1.InstanceState_INSTANCE_STATE_UNHEALTHY,
		nstancev1.InstanceState_INSTANCE_STATE_STOPPED:
		return true
	}
	return false
}

// startRolloutSampler samples every 10ms. Active instances are read shard
// a, shard b, shard a again and a's smaller count taken, so a member that
// leaves a while b's surge member arrives between two reads is not counted
// twice; ready members are the servers' ready_count.
func startRolloutSampler(clients []nstancev1.OperatorServiceClient, group string, pool client.ObjectKey) *rolloutSampler {
	s := &rolloutSampler{minReady: 1 << 30, messages: map[string]bool{}, stop: make(chan struct{}), done: make(chan struct{})}
	active := func(cl nstancev1.OperatorServiceClient) (int, bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := cl.ListInstances(ctx, &nstancev1.ListInstancesRequest{GroupIds: []string{group}})
		if err != nil {
			return 0, false
		}
		n := 0
		for _, inst := range resp.GetInstances() {
			if activeState(inst.GetState()) {
				n++
			}
		}
		return n, true
	}
	ready := func(cl nstancev1.OperatorServiceClient) (int, bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := cl.ListGroups(ctx, &nstancev1.ListGroupsRequest{})
		if err != nil {
			return 0, false
		}
		for _, g := range resp.GetGroups() {
			if g.GetSpec().GetGroupId() == group {
				return int(g.GetReadyCount()), true
			}
		}
		return 0, false
	}
	go func() {
		defer close(s.done)
		tk := time.NewTicker(10 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-tk.C:
			}
			a1, ok1 := active(clients[0])
			b, ok2 := active(clients[1])
			a2, ok3 := active(clients[0])
			ra, ok4 := ready(clients[0])
			rb, ok5 := ready(clients[1])
			var p infrav1.NstanceMachinePool
			errPool := env.Client.Get(context.Background(), pool, &p)
			s.mu.Lock()
			if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || errPool != nil {
				s.failures++
				s.mu.Unlock()
				continue
			}
			s.samples++
			s.maxActive = max(s.maxActive, min(a1, a2)+b)
			s.minReady = min(s.minReady, ra+rb)
			if n := len(s.upToDate); n == 0 || s.upToDate[n-1] != p.Status.UpToDateReplicas {
				s.upToDate = append(s.upToDate, p.Status.UpToDateReplicas)
			}
			if c := conditions.Get(&p, infrav1.RollingOutCondition); c != nil {
				s.messages[c.Message] = true
			}
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *rolloutSampler) finish() {
	close(s.stop)
	<-s.done
}

// TestRolloutOverShards is the acceptance line for rollouts: an
// image change on 6 replicas over 2 shards with maxSurge 1 and
// maxUnavailable 0 (the defaults) never has fewer than 6 ready members nor
// more than 7 instances pool-wide (sampled on both servers every 10ms), one
// shard rolling at a time; upToDateReplicas rises from 0 to 6 and RollingOut
// tells the progress per shard. Paused while a surge member is in flight,
// the pool finishes that one step and then replaces nothing more; the
// outdated members show UpToDate False on their NstanceMachines; resumed,
// the rollout finishes, with an Event for each step.
func TestRolloutOverShards(t *testing.T) {
	ctx := context.Background()
	provA, provB := newGatedProvider(), newGatedProvider()
	f := newFixtureWith(t, env.Client, func(o *shardtest.Options) { o.Provider = provA })
	shB := shardtest.Start(t, shardtest.Options{ClusterID: clusterID, ShardID: shardB, CA: f.ca, Provider: provB, Log: logr.Discard()})
	f.opts.Config.Shards[shardB] = opconfig.Shard{RegistrationAddr: f.opts.Config.Shards[shardID].RegistrationAddr, OperatorAddr: shB.OperatorAddr}
	f.opts.Config.CarryLabelPrefixes = []string{"example.com/"}
	f.opts.Config.CarryTaintPrefixes = []string{"example.com/"}
	clients := []nstancev1.OperatorServiceClient{f.shard.Client(t, tenant), shB.Client(t, tenant)}
	bindCAPIWorkloadRole(t, f.ns)
	startOperator(t, f.opts)
	startCAPI(t, f.ns, logr.Discard())

	const pool = "roll"
	key := client.ObjectKey{Namespace: f.ns, Name: pool}
	f.createPoolOn(t, pool, 6, 30*time.Second, shardID, shardB)
	var np infrav1.NstanceMachinePool
	// shardMembers: the active members of each shard by id, with whether the
	// server says they are outdated.
	shardMembers := func(i int) map[string]bool {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		resp, err := clients[i].ListInstances(cctx, &nstancev1.ListInstancesRequest{GroupIds: []string{pool}})
		require.NoError(t, err)
		out := map[string]bool{}
		for _, inst := range resp.GetInstances() {
			if activeState(inst.GetState()) {
				out[inst.GetInstanceId()] = inst.GetDrifted()
			}
		}
		return out
	}
	require.Eventually(t, func() bool {
		ms := poolMachines(t, f.ns, pool)
		running := 0
		for _, m := range ms {
			if m.Status.Phase == string(clusterv1.MachinePhaseRunning) {
				running++
			}
		}
		return running == 6 && len(shardMembers(0)) == 3 && len(shardMembers(1)) == 3 &&
			get(t, key, &np) && np.Status.UpToDateReplicas == 6 && conditions.IsFalse(&np, infrav1.RollingOutCondition)
	}, waitLong, tick, "6 Running members, 3 per shard, all up to date")

	// What a user added to the pool's Nodes, carried to their successors.
	for _, pid := range np.Spec.ProviderIDList {
		node, ok := nodeByProviderID(t, pid)
		require.True(t, ok, "Node of %s", pid)
		require.Eventually(t, func() bool {
			var n corev1.Node
			require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(&node), &n))
			if n.Labels == nil {
				n.Labels = map[string]string{}
			}
			n.Labels["example.com/team"] = "blue"
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: "example.com/dedicated", Value: "ml", Effect: corev1.TaintEffectNoSchedule})
			return env.Client.Update(ctx, &n) == nil
		}, waitLong, tick)
	}

	sampler := startRolloutSampler(clients, pool, key)
	// New members of shard a stay pending: the first surge member is caught
	// in flight.
	provA.hold.Store(true)
	setPool := func(mutate func(p *infrav1.NstanceMachinePool)) {
		t.Helper()
		require.Eventually(t, func() bool {
			var p infrav1.NstanceMachinePool
			require.True(t, get(t, key, &p))
			mutate(&p)
			return env.Client.Update(ctx, &p) == nil
		}, waitLong, tick)
	}
	setPool(func(p *infrav1.NstanceMachinePool) { p.Spec.Image = "node-v2" })

	require.Eventually(t, func() bool {
		a := shardMembers(0)
		return len(a) == 4 && get(t, key, &np) && conditions.IsTrue(&np, infrav1.RollingOutCondition) &&
			strings.Contains(conditions.Get(&np, infrav1.RollingOutCondition).Message, "shard "+shardID+" rolling")
	}, waitLong, tick, "shard a surges by one, its replacement held pending")
	require.Len(t, shardMembers(1), 3, "shard b waits")
	// While it rolls, cluster-autoscaler may not pick the pool's Nodes.
	require.Eventually(t, func() bool {
		guarded := 0
		for id := range shardMembers(1) {
			n := nodeByName(t, id)
			if n != nil && n.Annotations[rollguard.ScaleDownDisabledAnnotation] == "true" {
				guarded++
			}
		}
		return guarded == 3
	}, waitLong, tick, "shard b's Nodes carry scale-down-disabled during the rollout")

	// Pause with the surge member in flight.
	setPool(func(p *infrav1.NstanceMachinePool) { p.Spec.Strategy = &infrav1.MachinePoolStrategy{Paused: true} })
	require.Eventually(t, func() bool {
		return get(t, key, &np) && conditions.GetReason(&np, infrav1.RollingOutCondition) == infrav1.RolloutPausedReason
	}, waitLong, tick, "RollingOut says paused")
	for i, cl := range clients {
		require.Eventually(t, func() bool {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			resp, err := cl.ListGroups(cctx, &nstancev1.ListGroupsRequest{})
			require.NoError(t, err)
			for _, g := range resp.GetGroups() {
				if g.GetSpec().GetGroupId() == pool {
					return g.GetSpec().GetRollout().GetPaused()
				}
			}
			return false
		}, waitLong, tick, "shard %d's group is paused", i)
	}
	// Core CAPI marks every MachinePool Machine UpToDate; the outdated
	// members show on their NstanceMachines.
	require.Eventually(t, func() bool {
		var nms infrav1.NstanceMachineList
		require.NoError(t, env.Client.List(ctx, &nms, client.InNamespace(f.ns), client.MatchingLabels{infrav1.GroupLabel: pool}))
		outdated := 0
		for i := range nms.Items {
			if c := conditions.Get(&nms.Items[i], infrav1.UpToDateCondition); c != nil && c.Status == metav1.ConditionFalse && c.Reason == infrav1.NotUpToDateReason {
				outdated++
			}
		}
		return outdated == 6
	}, waitLong, tick, "the 6 outdated members are UpToDate False on their NstanceMachines")

	// The step in flight finishes: its member becomes ready, and the oldest
	// outdated member of shard a makes room. Then nothing moves.
	provA.release()
	require.Eventually(t, func() bool {
		a := shardMembers(0)
		fresh := 0
		for _, outdated := range a {
			if !outdated {
				fresh++
			}
		}
		return len(a) == 3 && fresh == 1
	}, waitLong, tick, "the step in flight finished")
	before := [2]map[string]bool{shardMembers(0), shardMembers(1)}
	require.Never(t, func() bool {
		return !maps.Equal(before[0], shardMembers(0)) || !maps.Equal(before[1], shardMembers(1))
	}, 3*time.Second, 100*time.Millisecond, "a paused rollout replaces nothing")
	require.True(t, get(t, key, &np))
	require.Equal(t, infrav1.RolloutPausedReason, conditions.GetReason(&np, infrav1.RollingOutCondition))

	// Resume: the rollout finishes, shard a first, then shard b.
	setPool(func(p *infrav1.NstanceMachinePool) { p.Spec.Strategy.Paused = false })
	require.Eventually(t, func() bool {
		for i := range clients {
			ms := shardMembers(i)
			if len(ms) != 3 || slices.Contains(slices.Collect(maps.Values(ms)), true) {
				return false
			}
		}
		running := 0
		for _, m := range poolMachines(t, f.ns, pool) {
			if m.Status.Phase == string(clusterv1.MachinePhaseRunning) && m.DeletionTimestamp.IsZero() {
				running++
			}
		}
		return running == 6 && get(t, key, &np) && np.Status.UpToDateReplicas == 6 &&
			conditions.GetReason(&np, infrav1.RollingOutCondition) == infrav1.NotRollingOutReason
	}, 2*waitLong, tick, "every member up to date, RollingOut False")
	sampler.finish()

	sampler.mu.Lock()
	defer sampler.mu.Unlock()
	t.Logf("%d samples (%d failed reads), most active %d, fewest ready %d, upToDateReplicas %v",
		sampler.samples, sampler.failures, sampler.maxActive, sampler.minReady, sampler.upToDate)
	require.Greater(t, sampler.samples, 50)
	require.LessOrEqual(t, sampler.maxActive, 7, "never more than replicas+maxSurge instances pool-wide")
	require.GreaterOrEqual(t, sampler.minReady, 6, "never fewer than replicas-maxUnavailable ready pool-wide")
	ups := sampler.upToDate
	require.Equal(t, int32(6), ups[0])
	require.Equal(t, int32(6), ups[len(ups)-1])
	require.LessOrEqual(t, slices.Min(ups), int32(1), "upToDateReplicas dropped to the new surge member at most")
	low := slices.Index(ups, slices.Min(ups))
	require.True(t, slices.IsSorted(ups[low:]), "upToDateReplicas only rises after the change: %v", ups)
	msgs := slices.Sorted(maps.Keys(sampler.messages))
	require.True(t, slices.ContainsFunc(msgs, func(m string) bool { return strings.Contains(m, "/6 up to date, shard "+shardID+" rolling") }), "%q", msgs)
	require.True(t, slices.ContainsFunc(msgs, func(m string) bool { return strings.Contains(m, "/6 up to date, shard "+shardB+" rolling") }), "%q", msgs)

	for _, reason := range []string{machinepool.EventRolloutStarted, machinepool.EventRolloutPaused, machinepool.EventRolloutResumed, machinepool.EventRolloutDone} {
		require.Len(t, events(t, f.ns, "NstanceMachinePool", pool, reason), 1, "one %s Event", reason)
	}
	steps := events(t, f.ns, "NstanceMachinePool", pool, machinepool.EventRolloutShardStep)
	var stepMsgs []string
	for _, e := range steps {
		stepMsgs = append(stepMsgs, e.Message)
	}
	require.Len(t, steps, 2, "one step per shard: %q", stepMsgs)
	require.Eventually(t, func() bool {
		var nms infrav1.NstanceMachineList
		require.NoError(t, env.Client.List(ctx, &nms, client.InNamespace(f.ns), client.MatchingLabels{infrav1.GroupLabel: pool}))
		upToDate := 0
		for i := range nms.Items {
			if nms.Items[i].DeletionTimestamp.IsZero() && conditions.IsTrue(&nms.Items[i], infrav1.UpToDateCondition) {
				upToDate++
			}
		}
		return upToDate == 6
	}, waitLong, tick, "every NstanceMachine UpToDate")

	// The new Nodes carry what the user put on the old ones; the guard is
	// gone with the rollout.
	// What the last look found missing, for the failure message; testify
	// runs the condition on its own goroutine, hence the lock.
	var (
		lackMu  sync.Mutex
		lacking []string
	)
	carried := assert.Eventually(t, func() bool {
		var missing []string
		for i := range clients {
			for id := range shardMembers(i) {
				n := nodeByName(t, id)
				switch {
				case n == nil:
					missing = append(missing, id+": no Node")
				case n.Annotations[rollguard.ScaleDownDisabledAnnotation] != "":
					missing = append(missing, id+": still guarded")
				case n.Labels["example.com/team"] != "blue" || !slices.ContainsFunc(n.Spec.Taints, func(tt corev1.Taint) bool {
					return tt.Key == "example.com/dedicated" && tt.Value == "ml" && tt.Effect == corev1.TaintEffectNoSchedule
				}):
					missing = append(missing, fmt.Sprintf("%s: labels %v taints %v", id, n.Labels, n.Spec.Taints))
				}
			}
		}
		lackMu.Lock()
		lacking = missing
		lackMu.Unlock()
		return len(missing) == 0
	}, waitLong, tick, "all 6 new Nodes carry the label and the taint, and none the scale-down guard")
	if !carried {
		var p infrav1.NstanceMachinePool
		_ = env.Client.Get(ctx, key, &p)
		lackMu.Lock()
		defer lackMu.Unlock()
		t.Fatalf("lacking (last completed look): %q; pool annotations %v", lacking, p.Annotations)
	}
}

func nodeByName(t *testing.T, name string) *corev1.Node {
	t.Helper()
	var n corev1.Node
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
		require.True(t, apierrors.IsNotFound(err), "get Node %s: %v", name, err)
		return nil
	}
	return &n
}
