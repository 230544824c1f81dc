package v1beta1_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

// TestInvalidObjectsRejected checks that the CRD schemas make the API server
// itself refuse bad objects: no webhook runs here.
func TestInvalidObjectsRejected(t *testing.T) {
	tests := []struct {
		name string
		// apply sends one bad create or update in namespace ns.
		apply func(t *testing.T, ns string) error
		// wantInMessage are substrings of the error naming the cause.
		wantInMessage []string
	}{
		{
			name: "pool without group",
			apply: func(t *testing.T, ns string) error {
				u := &unstructured.Unstructured{Object: map[string]any{
					"apiVersion": infrav1.GroupVersion.String(),
					"kind":       "NstanceMachinePool",
					"metadata":   map[string]any{"name": "no-group", "namespace": ns},
					"spec":       map[string]any{"shards": []any{"us-west-2a"}},
				}}
				return env.Client.Create(t.Context(), u)
			},
			wantInMessage: []string{"spec.group", "Required value"},
		},
		{
			name: "pool rolling update with maxSurge and maxUnavailable both 0",
			apply: func(t *testing.T, ns string) error {
				p := validPool()
				p.Namespace = ns
				p.Spec.Strategy = &infrav1.MachinePoolStrategy{RollingUpdate: &infrav1.MachineRollingUpdate{
					MaxSurge: ptr.To(intstr.FromString("0%")), MaxUnavailable: ptr.To(intstr.FromInt32(0))}}
				return env.Client.Create(t.Context(), p)
			},
			wantInMessage: []string{"spec.strategy.rollingUpdate", "must not both be 0"},
		},
		{
			name: "pool maxSurge neither a number nor a percentage",
			apply: func(t *testing.T, ns string) error {
				p := validPool()
				p.Namespace = ns
				p.Spec.Strategy = &infrav1.MachinePoolStrategy{RollingUpdate: &infrav1.MachineRollingUpdate{MaxSurge: ptr.To(intstr.FromString("two"))}}
				return env.Client.Create(t.Context(), p)
			},
			wantInMessage: []string{"spec.strategy.rollingUpdate.maxSurge", "percentage"},
		},
		{
			name: "pool maxUnavailable negative",
			apply: func(t *testing.T, ns string) error {
				p := validPool()
				p.Namespace = ns
				p.Spec.Strategy = &infrav1.MachinePoolStrategy{RollingUpdate: &infrav1.MachineRollingUpdate{MaxUnavailable: ptr.To(intstr.FromInt32(-1))}}
				return env.Client.Create(t.Context(), p)
			},
			wantInMessage: []string{"spec.strategy.rollingUpdate.maxUnavailable", "percentage"},
		},
		{
			name: "pool image with a space",
			apply: func(t *testing.T, ns string) error {
				p := validPool()
				p.Namespace, p.Spec.Image = ns, "ami 1"
				return env.Client.Create(t.Context(), p)
			},
			wantInMessage: []string{"spec.image", "should match"},
		},
		{
			name: "pool with empty shards",
			apply: func(t *testing.T, ns string) error {
				p := validPool()
				p.Namespace, p.Spec.Shards = ns, []string{}
				return env.Client.Create(t.Context(), p)
			},
			wantInMessage: []string{"spec.shards", "at least 1 items"},
		},
		{
			name: "pool without shards",
			apply: func(t *testing.T, ns string) error {
				p := validPool()
				p.Namespace, p.Spec.Shards = ns, nil
				return env.Client.Create(t.Context(), p)
			},
			wantInMessage: []string{"spec.shards", "Required value"},
		},
		{
			name: "pool with a shard twice",
			apply: func(t *testing.T, ns string) error {
				p := validPool()
				p.Namespace, p.Spec.Shards = ns, []string{"us-west-2a", "us-east-1a", "us-west-2a"}
				return env.Client.Create(t.Context(), p)
			},
			wantInMessage: []string{"spec.shards[2]", "Duplicate value"},
		},
		{
			name: "pool with an upper-case group",
			apply: func(t *testing.T, ns string) error {
				p := validPool()
				p.Namespace, p.Spec.Group = ns, "Workers"
				return env.Client.Create(t.Context(), p)
			},
			wantInMessage: []string{"spec.group", "should match"},
		},
		{
			name: "pool group with the shard-group separator",
			apply: func(t *testing.T, ns string) error {
				p := validPool()
				p.Namespace, p.Spec.Group = ns, "web--a"
				return env.Client.Create(t.Context(), p)
			},
			wantInMessage: []string{"spec.group", "should match"},
		},
		{
			name: "pool with a malformed shard",
			apply: func(t *testing.T, ns string) error {
				p := validPool()
				p.Namespace, p.Spec.Shards = ns, []string{"us_west"}
				return env.Client.Create(t.Context(), p)
			},
			wantInMessage: []string{"spec.shards[0]", "should match"},
		},
		{
			name: "pool group changed",
			apply: func(t *testing.T, ns string) error {
				p := validPool()
				p.Namespace = ns
				create(t, p)
				p.Spec.Group = "other"
				return env.Client.Update(t.Context(), p)
			},
			wantInMessage: []string{"spec.group", "group is immutable"},
		},
		{
			name: "machine template spec changed",
			apply: func(t *testing.T, ns string) error {
				mt := validMachineTemplate()
				mt.Namespace = ns
				create(t, mt)
				mt.Spec.Template.Spec.InstanceType = "m7i.xlarge"
				return env.Client.Update(t.Context(), mt)
			},
			wantInMessage: []string{"spec.template", "template is immutable: create a new NstanceMachineTemplate"},
		},
		{
			name: "machine template metadata changed",
			apply: func(t *testing.T, ns string) error {
				mt := validMachineTemplate()
				mt.Namespace = ns
				create(t, mt)
				mt.Spec.Template.ObjectMeta.Labels = map[string]string{"tier": "new"}
				return env.Client.Update(t.Context(), mt)
			},
			wantInMessage: []string{"spec.template", "template is immutable"},
		},
		{
			name: "shard group with negative size",
			apply: func(t *testing.T, ns string) error {
				g := validShardGroup()
				g.Namespace, g.Spec.Size = ns, -1
				return env.Client.Create(t.Context(), g)
			},
			wantInMessage: []string{"spec.size", "greater than or equal to 0"},
		},
		{
			name: "shard group shard changed",
			apply: func(t *testing.T, ns string) error {
				g := validShardGroup()
				g.Namespace = ns
				create(t, g)
				g.Spec.Shard = "us-east-1a"
				return env.Client.Update(t.Context(), g)
			},
			wantInMessage: []string{"spec.shard", "shard is immutable"},
		},
		{
			name: "machine address with an unknown type",
			apply: func(t *testing.T, ns string) error {
				m := validMachine()
				m.Namespace = ns
				create(t, m)
				m.Status.Addresses = []infrav1.MachineAddress{{Type: "PublicIP", Address: "198.51.100.1"}}
				return env.Client.Status().Update(t.Context(), m)
			},
			wantInMessage: []string{"status.addresses[0].type", "Unsupported value", `"PublicIP"`},
		},
		{
			name: "machine with a malformed shard override",
			apply: func(t *testing.T, ns string) error {
				m := validMachine()
				m.Namespace, m.Spec.Shard = ns, "-bad-"
				return env.Client.Create(t.Context(), m)
			},
			wantInMessage: []string{"spec.shard", "should match"},
		},
		{
			name: "machine instanceID changed",
			apply: func(t *testing.T, ns string) error {
				m := validMachine()
				m.Namespace = ns
				create(t, m)
				m.Spec.InstanceID = "i-8"
				return env.Client.Update(t.Context(), m)
			},
			wantInMessage: []string{"spec", "instanceID is immutable once set"},
		},
		{
			name: "machine instanceID removed",
			apply: func(t *testing.T, ns string) error {
				m := validMachine()
				m.Namespace = ns
				create(t, m)
				m.Spec.InstanceID = ""
				return env.Client.Update(t.Context(), m)
			},
			wantInMessage: []string{"spec", "instanceID is immutable once set"},
		},
		{
			name: "machine shard changed once set",
			apply: func(t *testing.T, ns string) error {
				m := validMachine()
				m.Namespace, m.Spec.InstanceID = ns, ""
				create(t, m)
				m.Spec.Shard = "us-east-1a"
				return env.Client.Update(t.Context(), m)
			},
			wantInMessage: []string{"spec", "shard is immutable once set"},
		},
		{
			name: "machine template naming an instance",
			apply: func(t *testing.T, ns string) error {
				mt := validMachineTemplate()
				mt.Namespace, mt.Spec.Template.Spec.InstanceID = ns, "i-7"
				return env.Client.Create(t.Context(), mt)
			},
			wantInMessage: []string{"spec.template", "a template must not name an instance"},
		},
		{
			name: "machine template without group",
			apply: func(t *testing.T, ns string) error {
				mt := validMachineTemplate()
				mt.Namespace, mt.Spec.Template.Spec.Group = ns, ""
				return env.Client.Create(t.Context(), mt)
			},
			wantInMessage: []string{"spec.template.spec.group", "at least 1 chars"},
		},
		{
			name: "cluster endpoint port out of range",
			apply: func(t *testing.T, ns string) error {
				c := validCluster()
				c.Namespace, c.Spec.ControlPlaneEndpoint.Port = ns, 70000
				return env.Client.Create(t.Context(), c)
			},
			wantInMessage: []string{"spec.controlPlaneEndpoint.port", "less than or equal to 65535"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := newNamespace(t)
			err := tt.apply(t, ns)
			require.Error(t, err)
			require.Truef(t, apierrors.IsInvalid(err), "want an Invalid error, got %T: %v", err, err)
			for _, want := range tt.wantInMessage {
				require.Contains(t, err.Error(), want)
			}
		})
	}
}
