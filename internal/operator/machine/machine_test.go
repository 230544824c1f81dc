package machine

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/shardconn"
)

func TestCreateToken(t *testing.T) {
	nm := func(ns, name, nonce string) *infrav1.NstanceMachine {
		m := &infrav1.NstanceMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		if nonce != "" {
			m.Annotations = map[string]string{CreateNonceAnnotation: nonce}
		}
		return m
	}
	base := CreateToken(nm("ns", "web-0", "n1"))
	require.Regexp(t, `^nm-[0-9a-f]{40}$`, base)

	// Stable: the same object, a copy after clusterctl move (other UID,
	// other labels, no status) gives the same token.
	moved := nm("ns", "web-0", "n1")
	moved.UID = "other"
	moved.Labels = map[string]string{"x": "y"}
	moved.Spec.Group = "g"
	require.Equal(t, base, CreateToken(moved))

	// Anything that names another object gives another token.
	for name, other := range map[string]*infrav1.NstanceMachine{
		"other nonce (a new object reusing the name)": nm("ns", "web-0", "n2"),
		"no nonce":        nm("ns", "web-0", ""),
		"other name":      nm("ns", "web-1", "n1"),
		"other namespace": nm("ns2", "web-0", "n1"),
	} {
		require.NotEqual(t, base, CreateToken(other), name)
	}
}

func TestMachineToInfra(t *testing.T) {
	m := func(group, kind, name string) *clusterv1.Machine {
		return &clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m"},
			Spec:       clusterv1.MachineSpec{InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: group, Kind: kind, Name: name}},
		}
	}
	want := []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: "ns", Name: "nm-1"}}}
	require.Equal(t, want, machineToInfra(context.Background(), m(infrav1.GroupVersion.Group, "NstanceMachine", "nm-1")))
	require.Nil(t, machineToInfra(context.Background(), m("infrastructure.cluster.x-k8s.io.other", "NstanceMachine", "nm-1")))
	require.Nil(t, machineToInfra(context.Background(), m(infrav1.GroupVersion.Group, "DockerMachine", "nm-1")))
	require.Nil(t, machineToInfra(context.Background(), m(infrav1.GroupVersion.Group, "NstanceMachine", "")))
	require.Nil(t, machineToInfra(context.Background(), &infrav1.NstanceMachine{}))
}

func newScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	require.NoError(t, clientgoscheme.AddToScheme(s))
	require.NoError(t, clusterv1.AddToScheme(s))
	require.NoError(t, infrav1.AddToScheme(s))
	return s
}

func ownedNM(machine string) *infrav1.NstanceMachine {
	nm := &infrav1.NstanceMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "nm-1"}}
	if machine != "" {
		nm.OwnerReferences = []metav1.OwnerReference{{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Name: machine, UID: "u"}}
	}
	return nm
}

func TestOwnerMachineAndDrainedByCAPI(t *testing.T) {
	ctx := context.Background()
	deleting := func(name string, mutate func(*clusterv1.Machine)) *clusterv1.Machine {
		m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name,
			DeletionTimestamp: &metav1.Time{Time: time.Unix(100, 0)}, Finalizers: []string{"hold"}}}
		if mutate != nil {
			mutate(m)
		}
		return m
	}
	live := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "live"}}
	started := deleting("started", func(m *clusterv1.Machine) {
		m.Status.Deletion = &clusterv1.MachineDeletionStatus{NodeDrainStartTime: metav1.Time{Time: time.Unix(200, 0)}}
	})
	excluded := deleting("excluded", func(m *clusterv1.Machine) {
		m.Annotations = map[string]string{clusterv1.ExcludeNodeDrainingAnnotation: "yes"}
	})
	notYet := deleting("not-yet", nil)
	cl := fake.NewClientBuilder().WithScheme(newScheme(t)).WithObjects(live, started, excluded, notYet).Build()
	r := &Reconciler{Client: cl}

	m, err := OwnerMachine(ctx, cl, ownedNM("live"))
	require.NoError(t, err)
	require.Equal(t, "live", m.Name)
	m, err = OwnerMachine(ctx, cl, ownedNM("missing"))
	require.NoError(t, err)
	require.Nil(t, m, "a missing Machine is no error")
	m, err = OwnerMachine(ctx, cl, ownedNM(""))
	require.NoError(t, err)
	require.Nil(t, m)
	other := ownedNM("live")
	other.OwnerReferences[0].APIVersion = "example.com/v1"
	m, err = OwnerMachine(ctx, cl, other)
	require.NoError(t, err)
	require.Nil(t, m, "a Machine of another API group is not the owner")

	for name, want := range map[string]bool{
		"":         false, // no Machine: the server drains
		"missing":  false,
		"live":     false, // not being deleted
		"not-yet":  false, // deleted, CAPI did not drain (yet)
		"started":  true,
		"excluded": true,
	} {
		got, err := r.drainedByCAPI(ctx, ownedNM(name))
		require.NoError(t, err)
		require.Equal(t, want, got, "Machine %q", name)
	}
}

// reconcilePasses runs three passes over nm (the first only sets the Paused
// condition) against a shard configured but
// not connected, and returns the stored object.
func reconcilePasses(t *testing.T, nm *infrav1.NstanceMachine) *infrav1.NstanceMachine {
	t.Helper()
	ctx := context.Background()
	cl := fake.NewClientBuilder().WithScheme(newScheme(t)).WithObjects(nm).WithStatusSubresource(&infrav1.NstanceMachine{}).Build()
	r := &Reconciler{
		Client: cl, Namespace: "ns", DefaultShard: "s1", PollInterval: time.Minute,
		Conns: shardconn.New(shardconn.Options{Shards: map[string]string{"s1": "127.0.0.1:1"}}),
	}
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(nm)}
	for range 3 {
		_, err := r.Reconcile(ctx, req)
		require.NoError(t, err)
	}
	var got infrav1.NstanceMachine
	require.NoError(t, cl.Get(ctx, req.NamespacedName, &got))
	return &got
}

func TestPoolInstanceNeverCreates(t *testing.T) {
	nm := &infrav1.NstanceMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pool-nm", Annotations: map[string]string{infrav1.PoolInstanceAnnotation: "i-7"}},
		Spec:       infrav1.NstanceMachineSpec{Group: "workers", Shard: "s1"},
	}
	got := reconcilePasses(t, nm)
	require.NotContains(t, got.Annotations, CreateNonceAnnotation, "a pool's NstanceMachine never prepares a create")
	require.Empty(t, got.Spec.InstanceID, "the pool instance stays named by its annotation")
	require.Equal(t, "i-7", got.Status.InstanceID)
	require.Equal(t, "s1", got.Status.Shard)
	require.False(t, conditions.Has(got, ConditionInstanceCreated))
	ready := conditions.Get(got, ConditionReady)
	require.NotNil(t, ready)
	require.Equal(t, ReasonShardUnreachable, ready.Reason)
	require.Contains(t, got.Finalizers, Finalizer)
}

func TestCreatePathStoresShardAndNonceFirst(t *testing.T) {
	// The same object without the pool annotation takes the create path:
	// shard and nonce are stored before any CreateInstance call, and kept.
	nm := &infrav1.NstanceMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "own-nm"},
		Spec:       infrav1.NstanceMachineSpec{Group: "workers"},
	}
	got := reconcilePasses(t, nm)
	require.Equal(t, "s1", got.Spec.Shard, "the default shard is stored")
	nonce := got.Annotations[CreateNonceAnnotation]
	require.NotEmpty(t, nonce)
	c := conditions.Get(got, ConditionInstanceCreated)
	require.NotNil(t, c)
	require.Equal(t, ReasonShardUnreachable, c.Reason, "the pass after storing them reaches the (unconnected) shard")
	again := reconcilePasses(t, got)
	require.Equal(t, nonce, again.Annotations[CreateNonceAnnotation], "the nonce never changes once stored")
}

func TestStatusInstanceMovesIntoSpec(t *testing.T) {
	// An object from before the instance moved into spec names it in
	// status only; the pass adopts it into spec instead of creating.
	nm := &infrav1.NstanceMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "old-nm"},
		Spec:       infrav1.NstanceMachineSpec{Group: "workers"},
		Status:     infrav1.NstanceMachineStatus{InstanceID: "i-3", Shard: "s1"},
	}
	got := reconcilePasses(t, nm)
	require.Equal(t, "i-3", got.Spec.InstanceID)
	require.Equal(t, "s1", got.Spec.Shard)
	require.NotContains(t, got.Annotations, CreateNonceAnnotation)
	c := conditions.Get(got, ConditionInstanceCreated)
	require.NotNil(t, c)
	require.Equal(t, ReasonAdopted, c.Reason)
}

func TestNoCreateInThePassThatStoresShardAndNonce(t *testing.T) {
	// The pass that stores shard and nonce ends there: the create call
	// comes in the next pass, once both are saved, so a create retried
	// after a crash or a move always carries the stored token. The shard is
	// configured but not connected, so a pass that went on to the create
	// would record ShardUnreachable instead of Creating.
	ctx := context.Background()
	nm := &infrav1.NstanceMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "store-nm"},
		Spec:       infrav1.NstanceMachineSpec{Group: "workers"},
	}
	cl := fake.NewClientBuilder().WithScheme(newScheme(t)).WithObjects(nm).WithStatusSubresource(&infrav1.NstanceMachine{}).Build()
	r := &Reconciler{
		Client: cl, Namespace: "ns", DefaultShard: "s1", PollInterval: time.Minute,
		Conns: shardconn.New(shardconn.Options{Shards: map[string]string{"s1": "127.0.0.1:1"}}),
	}
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(nm)}
	var got infrav1.NstanceMachine
	for pass := 1; ; pass++ {
		require.LessOrEqual(t, pass, 3, "no pass stored the create nonce")
		_, err := r.Reconcile(ctx, req)
		require.NoError(t, err)
		require.NoError(t, cl.Get(ctx, req.NamespacedName, &got))
		if got.Annotations[CreateNonceAnnotation] != "" {
			break
		}
		require.Empty(t, got.Spec.Shard, "shard and nonce are stored together")
	}
	require.Equal(t, "s1", got.Spec.Shard)
	c := conditions.Get(&got, ConditionInstanceCreated)
	require.NotNil(t, c)
	require.Equal(t, ReasonCreating, c.Reason, "the pass that stores shard and nonce does not go on to the shard: %s", c.Message)
}
