package manager_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/bootstrap"
	"github.com/nstance-dev/nstance/internal/operator/machine"
	"github.com/nstance-dev/nstance/internal/operator/shardconn"
	"github.com/nstance-dev/nstance/internal/pki"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// writeCounter counts the writes a client sends to the API server.
type writeCounter struct {
	mu     sync.Mutex
	writes []string
}

func (w *writeCounter) add(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes = append(w.writes, s)
}

func (w *writeCounter) reset() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.writes
	w.writes = nil
	return out
}

// wrap returns c with every write recorded; the writes still reach the
// real API server.
func (w *writeCounter) wrap(c client.WithWatch) client.Client {
	return interceptor.NewClient(c, interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			w.add("update " + obj.GetName())
			return c.Update(ctx, obj, opts...)
		},
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			w.add("patch " + obj.GetName())
			return c.Patch(ctx, obj, p, opts...)
		},
		SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
			w.add("update " + obj.GetName() + "/" + sub)
			return c.SubResource(sub).Update(ctx, obj, opts...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
			w.add("patch " + obj.GetName() + "/" + sub)
			return c.SubResource(sub).Patch(ctx, obj, p, opts...)
		},
	})
}

// shardConns connects to the fixture's shards as a registered operator
// would, without running an operator.
func (f *fixture) shardConns(t testing.TB) *shardconn.Manager {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	_, certPEM, err := f.ca.IssueClient(pki.ClientRequest{
		Identity:  pki.Identity{ClusterID: clusterID, Tenant: tenant, Role: pki.RoleOperator, ClientID: "machine-test"},
		PublicKey: pub, Validity: time.Hour,
	}, time.Now())
	require.NoError(t, err)
	keyPEM, err := pki.MarshalPrivateKeyPEM(priv)
	require.NoError(t, err)
	creds, err := bootstrap.Parse(f.ca.CertPEM, certPEM, keyPEM, clusterID, time.Now())
	require.NoError(t, err)
	addrs := map[string]string{}
	for id, s := range f.shards {
		addrs[id] = s.proxy.addr()
	}
	conns := shardconn.New(shardconn.Options{Shards: addrs, ClusterID: clusterID, Log: logr.Discard()})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, conns.Start(ctx, creds))
	for id := range addrs {
		wctx, wcancel := context.WithTimeout(ctx, waitLong)
		require.NoError(t, conns.WaitReady(wctx, id), "connect to shard %s", id)
		wcancel()
	}
	return conns
}

// TestMachineStatusWrites drives the NstanceMachine reconciler by hand, one
// Reconcile at a time, against the real API server and fake shards. It pins
// two status bugs that made TestMachineLifecycle flaky on a loaded machine:
//   - an instance already running when the reconciler first saw it (the
//     shard created it before the first status read) got Ready with a
//     providerID but lost status.instanceID and status.shard, because writing
//     spec.providerID overwrote the in-memory status with the server's;
//   - every later Reconcile patched the status although nothing changed (the
//     comparison printed pointers).
func TestMachineStatusWrites(t *testing.T) {
	f := newFixture(t, "shard-a", "shard-b")
	ctx := context.Background()
	shard := f.shards["shard-b"]
	_, err := shard.client(t).UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "solo", Template: "worker"}})
	require.NoError(t, err)

	var writes writeCounter
	direct, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	require.NoError(t, err)
	r := &machine.Reconciler{Client: writes.wrap(direct), Conns: f.shardConns(t), Namespace: f.ns,
		DefaultShard: "shard-a", PollInterval: 100 * time.Millisecond, Log: logr.Discard()}

	f.machinePair(t, "m-early", "solo", "shard-b")
	nm, ok := get(t, f.ns, "m-early", &infrav1.NstanceMachine{})
	require.True(t, ok)
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(nm)}
	// The first passes store the Paused condition, the finalizer, then the
	// shard and the create nonce, and create nothing yet.
	for pass := 0; nm.Annotations[machine.CreateNonceAnnotation] == ""; pass++ {
		require.Less(t, pass, 3, "the create nonce is stored within three passes")
		_, err = r.Reconcile(ctx, req)
		require.NoError(t, err)
		nm, ok = get(t, f.ns, "m-early", &infrav1.NstanceMachine{})
		require.True(t, ok)
	}
	require.Equal(t, "shard-b", nm.Spec.Shard)
	require.Empty(t, nm.Spec.InstanceID)
	// The shard creates the instance before the reconciler's create call
	// (as when its reply was lost): the same client token the reconciler
	// sends, so its CreateInstance returns this (already running) instance.
	resp, err := shard.client(t).CreateInstance(ctx, &nstancev1.CreateInstanceRequest{GroupId: "solo", ClientToken: machine.CreateToken(nm)})
	require.NoError(t, err)
	id := resp.GetInstance().GetInstanceId()
	require.Eventually(t, func() bool {
		return instanceState(t, shard, id) == nstancev1.InstanceState_INSTANCE_STATE_RUNNING
	}, waitLong, tick)

	_, err = r.Reconcile(ctx, req)
	require.NoError(t, err)
	nm, ok = get(t, f.ns, "m-early", &infrav1.NstanceMachine{})
	require.True(t, ok)
	require.Equal(t, resp.GetInstance().GetProviderId(), nm.Spec.ProviderID)
	require.Equal(t, id, nm.Spec.InstanceID, "the instance is named in spec")
	require.True(t, nm.Status.Ready)
	require.True(t, ptr.Deref(nm.Status.Initialization.Provisioned, false))
	require.Equal(t, id, nm.Status.InstanceID, "instanceID kept when providerID is written in the same pass")
	require.Equal(t, "shard-b", nm.Status.Shard, "shard kept when providerID is written in the same pass")
	require.Equal(t, "shard-b", nm.Status.FailureDomain)
	require.Equal(t, "running", nm.Status.State)
	require.NotEmpty(t, nm.Status.Addresses)
	require.Contains(t, nm.Finalizers, machine.Finalizer)

	// Writing providerID made a new generation; the next pass observes it.
	_, err = r.Reconcile(ctx, req)
	require.NoError(t, err)
	nm, ok = get(t, f.ns, "m-early", &infrav1.NstanceMachine{})
	require.True(t, ok)
	require.Equal(t, nm.Generation, nm.Status.ObservedGeneration)

	writes.reset()
	rv := nm.ResourceVersion
	for range 3 {
		_, err = r.Reconcile(ctx, req)
		require.NoError(t, err)
	}
	require.Empty(t, writes.reset(), "a Reconcile that changes nothing writes nothing")
	nm, ok = get(t, f.ns, "m-early", &infrav1.NstanceMachine{})
	require.True(t, ok)
	require.Equal(t, rv, nm.ResourceVersion)
}

// TestMachineDeletedBeforeCreateStored: the create call went out (the shard
// made the instance) but its reply was never stored, then the NstanceMachine
// is deleted. The reconciler finds the instance by its create token and
// deletes it instead of letting the finalizer go and leaking it.
func TestMachineDeletedBeforeCreateStored(t *testing.T) {
	f := newFixture(t, "shard-a", "shard-b")
	ctx := context.Background()
	shard := f.shards["shard-b"]
	_, err := shard.client(t).UpsertGroup(ctx, &nstancev1.UpsertGroupRequest{Group: &nstancev1.GroupSpec{GroupId: "solo", Template: "worker"}})
	require.NoError(t, err)
	r := &machine.Reconciler{Client: env.Client, Conns: f.shardConns(t), Namespace: f.ns,
		DefaultShard: "shard-a", PollInterval: 100 * time.Millisecond, Log: logr.Discard()}

	f.machinePair(t, "m-lost", "solo", "shard-b")
	nm, ok := get(t, f.ns, "m-lost", &infrav1.NstanceMachine{})
	require.True(t, ok)
	req := reconcile.Request{NamespacedName: client.ObjectKeyFromObject(nm)}
	for pass := 0; nm.Annotations[machine.CreateNonceAnnotation] == ""; pass++ {
		require.Less(t, pass, 3, "the create nonce is stored within three passes")
		_, err = r.Reconcile(ctx, req)
		require.NoError(t, err)
		nm, ok = get(t, f.ns, "m-lost", &infrav1.NstanceMachine{})
		require.True(t, ok)
	}
	resp, err := shard.client(t).CreateInstance(ctx, &nstancev1.CreateInstanceRequest{GroupId: "solo", ClientToken: machine.CreateToken(nm)})
	require.NoError(t, err)
	id := resp.GetInstance().GetInstanceId()

	require.NoError(t, env.Client.Delete(ctx, nm))
	_, err = r.Reconcile(ctx, req)
	require.NoError(t, err)
	nm, ok = get(t, f.ns, "m-lost", &infrav1.NstanceMachine{})
	require.True(t, ok, "the finalizer holds the object while its instance goes")
	require.Equal(t, id, nm.Spec.InstanceID, "found by the create token")
	require.Contains(t, []nstancev1.InstanceState{nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION,
		nstancev1.InstanceState_INSTANCE_STATE_DELETING, nstancev1.InstanceState_INSTANCE_STATE_DELETED},
		instanceState(t, shard, id), "the instance is being deleted")
}
