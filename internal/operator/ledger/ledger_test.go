package ledger_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/nstance-dev/nstance/internal/operator/ledger"
	"github.com/nstance-dev/nstance/internal/testing/kubetest"
)

func TestLedgerPersists(t *testing.T) {
	env := kubetest.Start(t)
	ctx := t.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "ledger-"}}
	require.NoError(t, env.Client.Create(ctx, ns))

	l := ledger.New(env.Client, ns.Name, "")
	got, err := l.Load(ctx, env.Client)
	require.NoError(t, err)
	require.Empty(t, got, "no ConfigMap yet")

	require.NoError(t, l.Record(ctx, "web", ledger.StateManaged))
	require.NoError(t, l.RecordMany(ctx, map[string]string{"db": ledger.StateManaged, "old": ledger.StateDeleted}))
	require.NoError(t, l.Record(ctx, "web", ledger.StateDeleted))

	// A fresh ledger (a restarted operator) sees everything.
	fresh := ledger.New(env.Client, ns.Name, "")
	got, err = fresh.Load(ctx, env.Client)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"web": ledger.StateDeleted, "db": ledger.StateManaged, "old": ledger.StateDeleted}, got)

	var cm corev1.ConfigMap
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: ledger.DefaultName}, &cm))
	require.Len(t, cm.Data, 3)
	require.Contains(t, cm.Labels, clusterctlv1.ClusterctlMoveLabel, "clusterctl move carries the ledger")
}

func TestOrphans(t *testing.T) {
	env := kubetest.Start(t)
	ctx := t.Context()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "ledger-"}}
	require.NoError(t, env.Client.Create(ctx, ns))
	l := ledger.New(env.Client, ns.Name, "")
	require.NoError(t, l.Record(ctx, "web", ledger.StateDeleted))
	require.NoError(t, l.RecordOrphan(ctx, "web", "s2"))
	require.NoError(t, l.RecordOrphan(ctx, "db", "s2"))
	require.NoError(t, l.RecordOrphan(ctx, "web", "s1"))
	got, err := ledger.New(env.Client, ns.Name, "").Load(ctx, env.Client)
	require.NoError(t, err)
	require.Equal(t, []ledger.Orphan{{Group: "web", Shard: "s1"}, {Group: "db", Shard: "s2"}, {Group: "web", Shard: "s2"}}, ledger.Orphans(got))
	require.Equal(t, []string{"web"}, ledger.Groups(got), "orphan keys are not groups")

	require.NoError(t, l.ForgetOrphan(ctx, "web", "s2"))
	require.NoError(t, l.ForgetOrphan(ctx, "web", "s2"), "idempotent")
	got, err = l.Load(ctx, env.Client)
	require.NoError(t, err)
	require.Equal(t, []ledger.Orphan{{Group: "web", Shard: "s1"}, {Group: "db", Shard: "s2"}}, ledger.Orphans(got))
	// Recording it again after a forget is written, not skipped as seen.
	require.NoError(t, l.RecordOrphan(ctx, "web", "s2"))
	got, err = ledger.New(env.Client, ns.Name, "").Load(ctx, env.Client)
	require.NoError(t, err)
	require.Len(t, ledger.Orphans(got), 3)
}
