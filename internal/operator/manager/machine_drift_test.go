package manager_test

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

// TestMachineDrift: an NstanceMachine (the MachineDeployment flavour) whose
// instance no longer matches the server's template shows it, UpToDate False
// with reason Drifted, and its instance stays (the server does not roll
// instances it created on demand).
func TestMachineDrift(t *testing.T) {
	f := newFixture(t, "shard-a")
	f.putNonce(t)
	o := f.options(t)
	o.MachinePollInterval = 100 * time.Millisecond
	r := startOperator(t, o)
	r.waitImported(t)
	f.createPool(t, "md", 0, "shard-a")
	f.waitGroupOnShards(t, "md", "shard-a")
	f.machinePair(t, "m-drift", "md", "shard-a")
	nm := waitMachineRunning(t, f.ns, "m-drift")
	upToDate := func() *metav1.Condition {
		got, ok := get(t, f.ns, "m-drift", &infrav1.NstanceMachine{})
		if !ok {
			return nil
		}
		for _, c := range got.Status.Conditions {
			if c.Type == infrav1.UpToDateCondition {
				return &c
			}
		}
		return nil
	}
	require.Eventually(t, func() bool {
		c := upToDate()
		return c != nil && c.Status == metav1.ConditionTrue
	}, waitLong, tick, "UpToDate True while the template is unchanged")

	// The shard's template gets another instance type.
	sh := f.shards["shard-a"].sh
	cur := sh.Config.Current()
	next := *cur
	next.Templates = maps.Clone(cur.Templates)
	w := next.Templates["worker"]
	w.InstanceType = "test.large"
	next.Templates["worker"] = w
	sh.Config.Set(&next, "drift", time.Now())
	// A change on the server brings no event: the periodic look
	// (machine.DriftRecheck) would; any update of the object does too.
	require.NoError(t, env.Client.Patch(context.Background(), &infrav1.NstanceMachine{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "m-drift"}},
		client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"annotations":{"test/poke":"1"}}}`))))
	require.Eventually(t, func() bool {
		c := upToDate()
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == infrav1.DriftedReason
	}, waitLong, tick, "UpToDate False (Drifted) after the template changed")
	require.Contains(t, upToDate().Message, nm.Status.InstanceID)
	got, _ := get(t, f.ns, "m-drift", &infrav1.NstanceMachine{})
	require.Equal(t, nm.Status.InstanceID, got.Status.InstanceID, "the instance stays")
	require.True(t, got.Status.Ready)
}
