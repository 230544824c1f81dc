package v1beta1_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cpv1 "github.com/nstance-dev/nstance/api/controlplane/v1beta1"
	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

// someTime is whole seconds: the API server stores times at that precision.
var someTime = metav1.NewTime(time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC))

func condition(typ string, status metav1.ConditionStatus, reason string) metav1.Condition {
	return metav1.Condition{
		Type:               typ,
		Status:             status,
		Reason:             reason,
		Message:            "set by " + typ + " test",
		ObservedGeneration: 1,
		LastTransitionTime: someTime,
	}
}

// roundTripCase drives one kind through create, status update and spec
// update against the real API server.
type roundTripCase[T client.Object] struct {
	// obj is a fully populated object (spec and status) without a namespace.
	obj T
	// empty returns a zero object to read into.
	empty func() T
	// spec and status return the parts compared after each read.
	spec   func(T) any
	status func(T) any
	// copyStatus copies the status of the first object into the second.
	copyStatus func(from, to T)
	// changeSpec alters the spec in a valid way; nil for a kind whose spec
	// cannot change (validation_test.go checks the refusal).
	changeSpec func(T)
}

// requireSemanticEqual compares API values the way the API server does
// (quantities and times by value).
func requireSemanticEqual(t *testing.T, want, got any, what string) {
	t.Helper()
	if !equality.Semantic.DeepEqual(want, got) {
		require.Equal(t, want, got, what)
		t.Fatalf("%s differs semantically:\nwant %#v\ngot  %#v", what, want, got)
	}
}

func (c roundTripCase[T]) run(t *testing.T) {
	ctx := t.Context()
	ns := newNamespace(t)
	full := c.obj.DeepCopyObject().(T)
	obj := c.obj.DeepCopyObject().(T)
	obj.SetNamespace(ns)

	// Create: the spec is stored; the status is not, because the status
	// subresource only accepts status through /status.
	create(t, obj)
	got := c.empty()
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(obj), got))
	requireSemanticEqual(t, c.spec(full), c.spec(got), "spec after create")
	require.True(t, reflect.ValueOf(c.status(got)).IsZero(), "status must be dropped on create, got %#v", c.status(got))
	require.Equal(t, int64(1), got.GetGeneration())

	// Status through the subresource: stored, generation unchanged.
	c.copyStatus(full, got)
	require.NoError(t, env.Client.Status().Update(ctx, got))
	afterStatus := c.empty()
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(obj), afterStatus))
	requireSemanticEqual(t, c.status(full), c.status(afterStatus), "status after status update")
	requireSemanticEqual(t, c.spec(full), c.spec(afterStatus), "spec after status update")
	require.Equal(t, int64(1), afterStatus.GetGeneration(), "a status update must not bump the generation")

	// A metadata-only update does not bump the generation either.
	afterStatus.SetLabels(map[string]string{"touched": "yes"})
	require.NoError(t, env.Client.Update(ctx, afterStatus))
	require.Equal(t, int64(1), afterStatus.GetGeneration(), "a label change must not bump the generation")

	if c.changeSpec == nil {
		return
	}
	// Spec change: stored, generation bumped, status kept.
	c.changeSpec(afterStatus)
	wantSpec := c.spec(afterStatus)
	require.NoError(t, env.Client.Update(ctx, afterStatus))
	afterSpec := c.empty()
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(obj), afterSpec))
	requireSemanticEqual(t, wantSpec, c.spec(afterSpec), "spec after spec update")
	require.NotEqual(t, c.spec(full), c.spec(afterSpec), "changeSpec must change the spec")
	requireSemanticEqual(t, c.status(full), c.status(afterSpec), "status after spec update")
	require.Equal(t, int64(2), afterSpec.GetGeneration(), "a spec update must bump the generation")
}

func validCluster() *infrav1.NstanceCluster {
	return &infrav1.NstanceCluster{
		ObjectMeta: metav1.ObjectMeta{Name: "prod"},
		Spec: infrav1.NstanceClusterSpec{
			ControlPlaneEndpoint: infrav1.APIEndpoint{Host: "api.prod.example.com", Port: 6443},
		},
		Status: infrav1.NstanceClusterStatus{
			Initialization: infrav1.InitializationStatus{Provisioned: ptr.To(true)},
			Ready:          true,
			FailureDomains: []infrav1.FailureDomain{
				{Name: "us-west-2a", ControlPlane: ptr.To(true), Attributes: map[string]string{"region": "us-west-2"}},
				{Name: "us-east-1a", ControlPlane: ptr.To(false)},
			},
			ObservedGeneration: 1,
			Conditions:         []metav1.Condition{condition(infrav1.ReadyCondition, metav1.ConditionTrue, infrav1.SyncedReason)},
		},
	}
}

func validPool() *infrav1.NstanceMachinePool {
	return &infrav1.NstanceMachinePool{
		ObjectMeta: metav1.ObjectMeta{Name: "workers"},
		Spec: infrav1.NstanceMachinePoolSpec{
			Group:        "workers",
			Shards:       []string{"us-west-2a", "us-east-1a"},
			Template:     "general",
			InstanceType: "m7i.large",
			SubnetPool:   "private",
			Vars:         map[string]string{"role": "worker", "disk": "100"},
			DrainTimeout: &metav1.Duration{Duration: 90 * time.Second},
			DeletePolicy: infrav1.DeletePolicyOldest,
			Image:        "ami-0123456789abcdef0",
			Strategy: &infrav1.MachinePoolStrategy{RollingUpdate: &infrav1.MachineRollingUpdate{
				MaxSurge: ptr.To(intstr.FromString("25%")), MaxUnavailable: ptr.To(intstr.FromInt32(1)),
			}},
			ProviderIDList: []string{"nstance://us-west-2a/i-1", "nstance://us-east-1a/i-2"},
		},
		Status: infrav1.NstanceMachinePoolStatus{
			Initialization:     infrav1.InitializationStatus{Provisioned: ptr.To(true)},
			Ready:              true,
			Replicas:           2,
			ReadyReplicas:      1,
			UpToDateReplicas:   3,
			ObservedGeneration: 1,
			Conditions: []metav1.Condition{
				condition(infrav1.ReadyCondition, metav1.ConditionFalse, infrav1.WaitingForReplicasReason),
				condition(infrav1.RollingOutCondition, metav1.ConditionTrue, infrav1.RollingOutReason),
			},
		},
	}
}

func validShardGroup() *infrav1.NstanceShardGroup {
	return &infrav1.NstanceShardGroup{
		ObjectMeta: metav1.ObjectMeta{Name: infrav1.ShardGroupName("workers", "us-west-2a")},
		Spec: infrav1.NstanceShardGroupSpec{
			Group:        "workers",
			Shard:        "us-west-2a",
			Size:         3,
			Template:     "general",
			InstanceType: "m7i.large",
			SubnetPool:   "private",
			Vars:         map[string]string{"role": "worker"},
			DrainTimeout: &metav1.Duration{Duration: 5 * time.Minute},
			Image:        "ami-0123456789abcdef0",
			Rollout:      &infrav1.ShardRollout{MaxSurge: ptr.To[int32](1), MaxUnavailable: 0},
		},
		Status: infrav1.NstanceShardGroupStatus{
			Replicas:           3,
			ReadyReplicas:      2,
			UpToDateReplicas:   1,
			ObservedInfra:      "0123456789abcdef",
			ProviderIDs:        []string{"nstance://us-west-2a/i-1", "nstance://us-west-2a/i-2", "nstance://us-west-2a/i-3"},
			LastSyncTime:       &someTime,
			ObservedGeneration: 1,
			Conditions: []metav1.Condition{
				condition(infrav1.ReadyCondition, metav1.ConditionFalse, infrav1.WaitingForReplicasReason),
				condition(infrav1.ShardReachableCondition, metav1.ConditionTrue, infrav1.ShardConnectedReason),
				condition(infrav1.ConfigValidCondition, metav1.ConditionTrue, infrav1.ConfigAcceptedReason),
			},
		},
	}
}

func validMachineSpec() infrav1.NstanceMachineSpec {
	return infrav1.NstanceMachineSpec{
		ProviderID:   "nstance://us-west-2a/i-7",
		Group:        "gpu",
		InstanceType: "g6.xlarge",
		Template:     "gpu",
		SubnetPool:   "private",
		Vars:         map[string]string{"driver": "550"},
		Shard:        "us-west-2a",
	}
}

func validMachine() *infrav1.NstanceMachine {
	spec := validMachineSpec()
	spec.InstanceID = "i-7"
	return &infrav1.NstanceMachine{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-7"},
		Spec:       spec,
		Status: infrav1.NstanceMachineStatus{
			Initialization: infrav1.InitializationStatus{Provisioned: ptr.To(true)},
			Ready:          true,
			InstanceID:     "i-7",
			Shard:          "us-west-2a",
			FailureDomain:  "us-west-2a",
			Addresses: []infrav1.MachineAddress{
				{Type: infrav1.MachineInternalIP, Address: "10.0.0.7"},
				{Type: infrav1.MachineHostName, Address: "gpu-7"},
				{Type: infrav1.MachineExternalIP, Address: "203.0.113.7"},
				{Type: infrav1.MachineInternalDNS, Address: "gpu-7.internal"},
				{Type: infrav1.MachineExternalDNS, Address: "gpu-7.example.com"},
			},
			State:              "running",
			FailureReason:      ptr.To("none"),
			FailureMessage:     ptr.To("no failure"),
			ObservedGeneration: 1,
			Conditions: []metav1.Condition{
				condition(infrav1.ReadyCondition, metav1.ConditionTrue, infrav1.InstanceRunningReason),
				condition(infrav1.InstanceProvisionedCondition, metav1.ConditionTrue, infrav1.InstanceRunningReason),
			},
		},
	}
}

func validMachineTemplate() *infrav1.NstanceMachineTemplate {
	return &infrav1.NstanceMachineTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-template"},
		Spec: infrav1.NstanceMachineTemplateSpec{
			Template: infrav1.NstanceMachineTemplateResource{
				ObjectMeta: infrav1.ObjectMeta{
					Labels:      map[string]string{"tier": "gpu"},
					Annotations: map[string]string{"note": "made from template"},
				},
				Spec: validMachineSpec(),
			},
		},
		Status: infrav1.NstanceMachineTemplateStatus{
			Capacity: corev1.ResourceList{
				corev1.ResourceCPU:    resource.MustParse("4"),
				corev1.ResourceMemory: resource.MustParse("16Gi"),
			},
			Conditions: []metav1.Condition{condition(infrav1.ReadyCondition, metav1.ConditionTrue, infrav1.SyncedReason)},
		},
	}
}

func validControlPlane() *cpv1.NstanceControlPlane {
	return &cpv1.NstanceControlPlane{
		ObjectMeta: metav1.ObjectMeta{Name: "prod", Labels: map[string]string{"cluster.x-k8s.io/cluster-name": "prod"}},
		Spec:       cpv1.NstanceControlPlaneSpec{ControlPlaneEndpoint: infrav1.APIEndpoint{Host: "10.0.0.1", Port: 6443}},
		Status: cpv1.NstanceControlPlaneStatus{
			Initialization:              cpv1.NstanceControlPlaneInitializationStatus{ControlPlaneInitialized: ptr.To(true)},
			ExternalManagedControlPlane: ptr.To(true),
			ObservedGeneration:          1,
			Conditions: []metav1.Condition{
				condition(cpv1.AvailableCondition, metav1.ConditionTrue, cpv1.KubeconfigAvailableReason),
				condition(cpv1.ReadyCondition, metav1.ConditionTrue, cpv1.KubeconfigAvailableReason),
			},
		},
	}
}

// TestPoolReplicasZeroIsStored: status.replicas is written even at zero,
// so core Cluster API reads 0 instead of keeping the previous count.
func TestPoolReplicasZeroIsStored(t *testing.T) {
	ctx := t.Context()
	pool := validPool()
	pool.Namespace = newNamespace(t)
	create(t, pool)
	pool.Status = infrav1.NstanceMachinePoolStatus{Replicas: 0, Ready: true}
	require.NoError(t, env.Client.Status().Update(ctx, pool))
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(infrav1.GroupVersion.WithKind("NstanceMachinePool"))
	require.NoError(t, env.Client.Get(ctx, client.ObjectKeyFromObject(pool), u))
	replicas, found, err := unstructured.NestedInt64(u.Object, "status", "replicas")
	require.NoError(t, err)
	require.True(t, found, "status.replicas missing at zero: %v", u.Object["status"])
	require.Zero(t, replicas)
}

func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		run  func(*testing.T)
	}{
		{"NstanceCluster", roundTripCase[*infrav1.NstanceCluster]{
			obj:        validCluster(),
			empty:      func() *infrav1.NstanceCluster { return &infrav1.NstanceCluster{} },
			spec:       func(o *infrav1.NstanceCluster) any { return o.Spec },
			status:     func(o *infrav1.NstanceCluster) any { return o.Status },
			copyStatus: func(from, to *infrav1.NstanceCluster) { to.Status = *from.Status.DeepCopy() },
			changeSpec: func(o *infrav1.NstanceCluster) { o.Spec.ControlPlaneEndpoint.Port = 443 },
		}.run},
		{"NstanceMachinePool", roundTripCase[*infrav1.NstanceMachinePool]{
			obj:        validPool(),
			empty:      func() *infrav1.NstanceMachinePool { return &infrav1.NstanceMachinePool{} },
			spec:       func(o *infrav1.NstanceMachinePool) any { return o.Spec },
			status:     func(o *infrav1.NstanceMachinePool) any { return o.Status },
			copyStatus: func(from, to *infrav1.NstanceMachinePool) { to.Status = *from.Status.DeepCopy() },
			changeSpec: func(o *infrav1.NstanceMachinePool) {
				o.Spec.Shards = append(o.Spec.Shards, "eu-west-1a")
				o.Spec.DrainTimeout = nil
			},
		}.run},
		{"NstanceShardGroup", roundTripCase[*infrav1.NstanceShardGroup]{
			obj:        validShardGroup(),
			empty:      func() *infrav1.NstanceShardGroup { return &infrav1.NstanceShardGroup{} },
			spec:       func(o *infrav1.NstanceShardGroup) any { return o.Spec },
			status:     func(o *infrav1.NstanceShardGroup) any { return o.Status },
			copyStatus: func(from, to *infrav1.NstanceShardGroup) { to.Status = *from.Status.DeepCopy() },
			// Size zero must survive: it is a real value, not "unset".
			changeSpec: func(o *infrav1.NstanceShardGroup) { o.Spec.Size = 0 },
		}.run},
		{"NstanceMachine", roundTripCase[*infrav1.NstanceMachine]{
			obj:        validMachine(),
			empty:      func() *infrav1.NstanceMachine { return &infrav1.NstanceMachine{} },
			spec:       func(o *infrav1.NstanceMachine) any { return o.Spec },
			status:     func(o *infrav1.NstanceMachine) any { return o.Status },
			copyStatus: func(from, to *infrav1.NstanceMachine) { to.Status = *from.Status.DeepCopy() },
			changeSpec: func(o *infrav1.NstanceMachine) { o.Spec.Vars["driver"] = "560" },
		}.run},
		{"NstanceControlPlane", roundTripCase[*cpv1.NstanceControlPlane]{
			obj:        validControlPlane(),
			empty:      func() *cpv1.NstanceControlPlane { return &cpv1.NstanceControlPlane{} },
			spec:       func(o *cpv1.NstanceControlPlane) any { return o.Spec },
			status:     func(o *cpv1.NstanceControlPlane) any { return o.Status },
			copyStatus: func(from, to *cpv1.NstanceControlPlane) { to.Status = *from.Status.DeepCopy() },
			changeSpec: func(o *cpv1.NstanceControlPlane) { o.Spec.ControlPlaneEndpoint.Port = 443 },
		}.run},
		{"NstanceMachineTemplate", roundTripCase[*infrav1.NstanceMachineTemplate]{
			obj:        validMachineTemplate(),
			empty:      func() *infrav1.NstanceMachineTemplate { return &infrav1.NstanceMachineTemplate{} },
			spec:       func(o *infrav1.NstanceMachineTemplate) any { return o.Spec },
			status:     func(o *infrav1.NstanceMachineTemplate) any { return o.Status },
			copyStatus: func(from, to *infrav1.NstanceMachineTemplate) { to.Status = *from.Status.DeepCopy() },
			// The template is immutable.
		}.run},
	}
	for _, tt := range tests {
		t.Run(tt.name, tt.run)
	}
}
