package machine

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/shardconn"
)

// bootstrapFixture is an NstanceMachine owned by Machine "m" whose
// spec.bootstrap.dataSecretName is secret, against a configured but
// unconnected shard.
func bootstrapFixture(t *testing.T, secret *string, objs ...client.Object) (*Reconciler, *events.FakeRecorder, reconcile.Request) {
	t.Helper()
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m"},
		Spec: clusterv1.MachineSpec{ClusterName: "c", Bootstrap: clusterv1.Bootstrap{DataSecretName: secret},
			InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceMachine", Name: "nm-1"}},
	}
	nm := ownedNM("m")
	nm.Spec.Group = "workers"
	cl := fake.NewClientBuilder().WithScheme(newScheme(t)).WithObjects(append(objs, m, nm)...).WithStatusSubresource(&infrav1.NstanceMachine{}).Build()
	rec := events.NewFakeRecorder(16)
	r := &Reconciler{
		Client: cl, Namespace: "ns", DefaultShard: "s1", PollInterval: time.Minute, Recorder: rec,
		Conns: shardconn.New(shardconn.Options{Shards: map[string]string{"s1": "127.0.0.1:1"}}),
	}
	return r, rec, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(nm)}
}

func passes(t *testing.T, r *Reconciler, req reconcile.Request, n int) *infrav1.NstanceMachine {
	t.Helper()
	for range n {
		_, err := r.Reconcile(context.Background(), req)
		require.NoError(t, err)
	}
	var got infrav1.NstanceMachine
	require.NoError(t, r.Client.Get(context.Background(), req.NamespacedName, &got))
	return &got
}

func TestWaitsForBootstrapData(t *testing.T) {
	r, _, req := bootstrapFixture(t, nil)
	got := passes(t, r, req, 3)
	for _, typ := range []string{ConditionInstanceCreated, ConditionReady} {
		c := conditions.Get(got, typ)
		require.NotNil(t, c, typ)
		require.Equal(t, metav1.ConditionFalse, c.Status)
		require.Equal(t, infrav1.WaitingForBootstrapDataReason, c.Reason, typ)
		require.Contains(t, c.Message, "Machine m")
	}
	require.NotContains(t, got.Annotations, CreateNonceAnnotation, "nothing is prepared for a create")
	require.Empty(t, got.Spec.Shard)

	// The bootstrap provider names its Secret: the create goes ahead.
	var m clusterv1.Machine
	require.NoError(t, r.Client.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: "m"}, &m))
	m.Spec.Bootstrap.DataSecretName = ptr.To("boot")
	require.NoError(t, r.Client.Update(context.Background(), &m))
	require.NoError(t, r.Client.Create(context.Background(), &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "boot"}, Data: map[string][]byte{"value": []byte("#cloud-config\n")},
	}))
	got = passes(t, r, req, 2)
	require.NotEmpty(t, got.Annotations[CreateNonceAnnotation])
	require.Equal(t, ReasonShardUnreachable, conditions.Get(got, ConditionInstanceCreated).Reason, "the create reached the (unconnected) shard")
}

func TestEmptyDataSecretNameUsesTheTemplate(t *testing.T) {
	// On-demand and imported Machines name no Secret on purpose ("", as
	// core CAPI does for MachinePool Machines): no waiting.
	r, _, req := bootstrapFixture(t, ptr.To(""))
	got := passes(t, r, req, 3)
	require.NotEmpty(t, got.Annotations[CreateNonceAnnotation])
	require.Equal(t, ReasonShardUnreachable, conditions.Get(got, ConditionInstanceCreated).Reason)
}

func TestBootstrapDataSecretProblems(t *testing.T) {
	r, _, req := bootstrapFixture(t, ptr.To("absent"))
	got := passes(t, r, req, 3)
	require.Equal(t, infrav1.BootstrapDataSecretNotFoundReason, conditions.Get(got, ConditionInstanceCreated).Reason)
	require.NotContains(t, got.Annotations, CreateNonceAnnotation)

	bad := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "bad"}, Data: map[string][]byte{"format": []byte("cloud-config")}}
	r, rec, req := bootstrapFixture(t, ptr.To("bad"), bad)
	got = passes(t, r, req, 3)
	c := conditions.Get(got, ConditionInstanceCreated)
	require.Equal(t, infrav1.BootstrapDataSecretInvalidReason, c.Reason)
	require.Contains(t, c.Message, "ns/bad")
	require.Contains(t, c.Message, "value")
	require.Equal(t, infrav1.BootstrapDataSecretInvalidReason, conditions.Get(got, ConditionReady).Reason)
	require.Len(t, rec.Events, 1, "one Warning Event, not one per pass")
	ev := <-rec.Events
	require.Contains(t, ev, "Warning "+infrav1.BootstrapDataSecretInvalidReason)
	require.NotContains(t, got.Annotations, CreateNonceAnnotation)
}
