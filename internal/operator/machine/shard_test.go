package machine

import (
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

func TestChooseShard(t *testing.T) {
	nm := func(shard string, managed bool) *infrav1.NstanceMachine {
		m := &infrav1.NstanceMachine{Spec: infrav1.NstanceMachineSpec{Group: "g", Shard: shard}}
		if managed {
			m.Labels = map[string]string{clusterv1.ClusterNameLabel: "c"}
		}
		return m
	}
	cloned := func(shard string) *infrav1.NstanceMachine {
		m := nm(shard, true)
		m.Annotations = map[string]string{clusterv1.TemplateClonedFromNameAnnotation: "md-0"}
		return m
	}
	machine := func(fd string) *clusterv1.Machine {
		return &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m-1"}, Spec: clusterv1.MachineSpec{FailureDomain: fd}}
	}
	tests := []struct {
		name    string
		nm      *infrav1.NstanceMachine
		machine *clusterv1.Machine
		shard   string
		reason  string
	}{
		{"failure domain alone", nm("", true), machine("b"), "b", ""},
		{"failure domain equal to spec.shard", nm("b", true), machine("b"), "b", ""},
		{"failure domain against another spec.shard", nm("a", true), machine("b"), "", ReasonShardMismatch},
		{"spec.shard when the Machine has no failure domain", nm("a", true), machine(""), "a", ""},
		{"default when neither is set", nm("", true), machine(""), "dflt", ""},
		{"managed without its Machine waits", nm("", true), nil, "", ReasonWaitingForMachine},
		{"managed with spec.shard needs no Machine (on-demand)", nm("a", true), nil, "a", ""},
		{"cloned from a template waits for its Machine despite spec.shard", cloned("a"), nil, "", ReasonWaitingForMachine},
		{"cloned from a template against its Machine's failure domain", cloned("a"), machine("b"), "", ReasonShardMismatch},
		{"standalone takes spec.shard", nm("a", false), nil, "a", ""},
		{"standalone takes the default", nm("", false), nil, "dflt", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := chooseShard(tt.nm, tt.machine, "dflt")
			require.Equal(t, tt.shard, p.shard)
			require.Equal(t, tt.reason, p.reason)
			if tt.reason != "" {
				require.NotEmpty(t, p.message)
			}
		})
	}
	p := chooseShard(nm("a", true), machine("b"), "dflt")
	require.Contains(t, p.message, `spec.shard "a"`)
	require.Contains(t, p.message, `failureDomain "b"`)
	require.Contains(t, p.message, "Machine m-1")
}
