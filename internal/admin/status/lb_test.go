package status

import (
	"testing"

	"github.com/stretchr/testify/require"

	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func TestLoadBalancerColumn(t *testing.T) {
	_, insts := rows(nil, []*nstancev1.InstanceStatus{
		{InstanceId: "a", LoadBalancers: []*nstancev1.LoadBalancerTarget{
			{Name: "api", State: nstancev1.LoadBalancerTargetState_LOAD_BALANCER_TARGET_STATE_PENDING, LastError: "refused"},
			{Name: "www", State: nstancev1.LoadBalancerTargetState_LOAD_BALANCER_TARGET_STATE_REGISTERED},
		}},
		{InstanceId: "b"},
	})
	require.Equal(t, "api: pending (refused), www: registered", insts[0].LoadBalancers)
	require.Empty(t, insts[1].LoadBalancers, "no load balancers: no column text (the page shows —)")
}
