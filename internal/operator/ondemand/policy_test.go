package ondemand

import (
	"testing"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

func TestDecide(t *testing.T) {
	mk := func(name, group, instanceType string, od *infrav1.OnDemandSpec, shards ...string) infrav1.NstanceMachinePool {
		return infrav1.NstanceMachinePool{ObjectMeta: metav1.ObjectMeta{Namespace: "ops", Name: name},
			Spec: infrav1.NstanceMachinePoolSpec{Group: group, InstanceType: instanceType, Shards: shards, OnDemand: od}}
	}
	deleting := mk("old", "old", "", &infrav1.OnDemandSpec{Enabled: true}, "a")
	deleting.DeletionTimestamp = ptr.To(metav1.Now())
	pools := []infrav1.NstanceMachinePool{
		mk("web", "web", "m7i.large", &infrav1.OnDemandSpec{Enabled: true}, "a", "b"),
		mk("gpu", "gpu", "", &infrav1.OnDemandSpec{Enabled: true, AllowedInstanceTypes: []string{"g5.xlarge", "g5.2xlarge"}, MaxInstances: ptr.To[int32](2)}, "b", "c"),
		mk("off", "off", "m7i.large", &infrav1.OnDemandSpec{Enabled: false, MaxInstances: ptr.To[int32](5)}, "a"),
		mk("plain", "plain", "test.small", nil, "a"),
		mk("none", "none", "", &infrav1.OnDemandSpec{Enabled: true, MaxInstances: ptr.To[int32](0)}, "a"),
		mk("dup-1", "dup", "", &infrav1.OnDemandSpec{Enabled: true}, "a"),
		mk("dup-2", "dup", "", &infrav1.OnDemandSpec{Enabled: true}, "a"),
		deleting,
	}
	operatorOnly := Policy{OperatorNamespace: "ops"}
	listed := Policy{OperatorNamespace: "ops", Namespaces: []string{"batch", "team-a"}}
	tests := []struct {
		name    string
		policy  Policy
		req     Request
		count   int
		want    Decision
		message string   // part of the refusal message
		untold  []string // never in the refusal message
	}{
		{name: "operator's namespace, group's type, first shard", policy: operatorOnly,
			req: Request{Namespace: "ops", Group: "web"}, want: Decision{Pool: "web", Shard: "a"}},
		{name: "pool's own instance type and another of its shards", policy: operatorOnly,
			req: Request{Namespace: "ops", Group: "web", InstanceType: "m7i.large", Shard: "b"}, want: Decision{Pool: "web", InstanceType: "m7i.large", Shard: "b"}},
		{name: "listed instance type", policy: operatorOnly,
			req: Request{Namespace: "ops", Group: "gpu", InstanceType: "g5.2xlarge"}, count: 1, want: Decision{Pool: "gpu", InstanceType: "g5.2xlarge", Shard: "b"}},
		{name: "listed namespace", policy: listed,
			req: Request{Namespace: "team-a", Group: "web"}, want: Decision{Pool: "web", Shard: "a"}},
		{name: "default maxInstances leaves room below 10", policy: operatorOnly,
			req: Request{Namespace: "ops", Group: "web"}, count: 9, want: Decision{Pool: "web", Shard: "a"}},

		{name: "another namespace, default policy", policy: operatorOnly, req: Request{Namespace: "team-a", Group: "web"},
			want: Decision{Refused: RefusedNamespace}, message: `namespace "team-a" may not ask for on-demand instances (allowed namespaces: ops;`},
		{name: "operator's namespace not in an explicit list", policy: listed, req: Request{Namespace: "ops", Group: "web"},
			want: Decision{Refused: RefusedNamespace}, message: "allowed namespaces: batch, team-a"},
		{name: "no pool has the group", policy: operatorOnly, req: Request{Namespace: "ops", Group: "tenant-group"},
			want: Decision{Refused: RefusedNoPool}, message: `no NstanceMachinePool with group "tenant-group" in namespace ops`},
		{name: "two pools have the group", policy: operatorOnly, req: Request{Namespace: "ops", Group: "dup"},
			want: Decision{Refused: RefusedNoPool}, message: "more than one NstanceMachinePool (dup-1, dup-2)"},
		{name: "pool being deleted", policy: operatorOnly, req: Request{Namespace: "ops", Group: "old"},
			want: Decision{Refused: RefusedNoPool}, message: "being deleted"},
		{name: "pool without onDemand", policy: operatorOnly, req: Request{Namespace: "ops", Group: "plain"},
			want: Decision{Refused: RefusedNotEnabled}, message: "NstanceMachinePool plain does not accept on-demand pods (spec.onDemand.enabled is not true)"},
		{name: "pool with onDemand disabled", policy: operatorOnly, req: Request{Namespace: "ops", Group: "off"},
			want: Decision{Refused: RefusedNotEnabled}, message: "spec.onDemand.enabled"},
		{name: "instance type not allowed", policy: operatorOnly, req: Request{Namespace: "ops", Group: "web", InstanceType: "p5.48xlarge"},
			want: Decision{Refused: RefusedInstanceType}, message: `instance type "p5.48xlarge" is not allowed for on-demand pods of NstanceMachinePool web (allowed: m7i.large;`},
		{name: "instance type of a pool without one", policy: operatorOnly, req: Request{Namespace: "ops", Group: "none", InstanceType: "test.small"},
			want: Decision{Refused: RefusedInstanceType}, message: "allowed: only the group's own type"},
		{name: "instance type not in the list", policy: operatorOnly, req: Request{Namespace: "ops", Group: "gpu", InstanceType: "p5.48xlarge"},
			want: Decision{Refused: RefusedInstanceType}, message: "allowed: g5.xlarge, g5.2xlarge"},
		{name: "shard outside the pool", policy: operatorOnly, req: Request{Namespace: "ops", Group: "web", Shard: "c"},
			want: Decision{Refused: RefusedShard}, message: `shard "c" is not one of NstanceMachinePool web's shards (a, b)`},
		{name: "at maxInstances", policy: operatorOnly, req: Request{Namespace: "ops", Group: "gpu"}, count: 2,
			want: Decision{Refused: RefusedMaxInstances}, message: "NstanceMachinePool gpu has 2 on-demand instances, spec.onDemand.maxInstances is 2"},
		{name: "at the default maxInstances", policy: operatorOnly, req: Request{Namespace: "ops", Group: "web"}, count: 10,
			want: Decision{Refused: RefusedMaxInstances}, message: "maxInstances is 10"},
		{name: "maxInstances 0", policy: operatorOnly, req: Request{Namespace: "ops", Group: "none"},
			want: Decision{Refused: RefusedMaxInstances}, message: "maxInstances is 0"},
		{name: "namespace first: nothing about the pool is told", policy: operatorOnly, req: Request{Namespace: "x", Group: "plain", InstanceType: "p5.48xlarge"},
			want: Decision{Refused: RefusedNamespace}, message: `namespace "x"`, untold: []string{"plain", "p5.48xlarge", "onDemand"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Decide(tt.policy, tt.req, pools, tt.count)
			require.Contains(t, got.Message, tt.message)
			for _, u := range tt.untold {
				require.NotContains(t, got.Message, u)
			}
			got.Message = ""
			require.Equal(t, tt.want, got)
		})
	}
}

func TestAllowedNamespaces(t *testing.T) {
	require.Equal(t, []string{"ops"}, Policy{OperatorNamespace: "ops"}.AllowedNamespaces())
	require.Equal(t, []string{"a", "b"}, Policy{OperatorNamespace: "ops", Namespaces: []string{"a", "b"}}.AllowedNamespaces())
	require.False(t, Policy{OperatorNamespace: "ops"}.NamespaceAllowed(""))
}
