package shardgroup

import (
	"testing"

	"github.com/stretchr/testify/require"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

// TestRemaining: a deleted group's shard group waits for every member whose
// VM may exist, whatever its state, and for no on-demand instance.
func TestRemaining(t *testing.T) {
	inst := func(id string, st nstancev1.InstanceState, token string) *nstancev1.InstanceStatus {
		return &nstancev1.InstanceStatus{InstanceId: id, State: st, ClientToken: token}
	}
	for _, tc := range []struct {
		name  string
		insts []*nstancev1.InstanceStatus
		want  []string
	}{
		{"none", nil, nil},
		{"all gone", []*nstancev1.InstanceStatus{
			inst("a", nstancev1.InstanceState_INSTANCE_STATE_DELETED, ""),
			inst("b", nstancev1.InstanceState_INSTANCE_STATE_FAILED, ""),
		}, nil},
		{"draining and deleting", []*nstancev1.InstanceStatus{
			inst("a", nstancev1.InstanceState_INSTANCE_STATE_PENDING_DELETION, ""),
			inst("b", nstancev1.InstanceState_INSTANCE_STATE_DELETING, ""),
			inst("c", nstancev1.InstanceState_INSTANCE_STATE_DELETED, ""),
		}, []string{"a", "b"}},
		{"pending and surge instances not yet deleted", []*nstancev1.InstanceStatus{
			inst("p", nstancev1.InstanceState_INSTANCE_STATE_PENDING, ""),
			inst("c", nstancev1.InstanceState_INSTANCE_STATE_CREATING, ""),
			inst("r", nstancev1.InstanceState_INSTANCE_STATE_RUNNING, ""),
			inst("u", nstancev1.InstanceState_INSTANCE_STATE_UNHEALTHY, ""),
			inst("s", nstancev1.InstanceState_INSTANCE_STATE_STOPPED, ""),
			inst("x", nstancev1.InstanceState_INSTANCE_STATE_UNSPECIFIED, ""),
		}, []string{"p", "c", "r", "u", "s", "x"}},
		{"on-demand instances are their NstanceMachines'", []*nstancev1.InstanceStatus{
			inst("od", nstancev1.InstanceState_INSTANCE_STATE_RUNNING, "token"),
			inst("m", nstancev1.InstanceState_INSTANCE_STATE_RUNNING, ""),
		}, []string{"m"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, Remaining(tc.insts))
		})
	}
}
