package manager_test

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	srvconfig "github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/aws"
	"github.com/nstance-dev/nstance/internal/server/provider/aws/fake"
	"github.com/nstance-dev/nstance/internal/server/shardtest"
)

// startAWSShard adds a shard whose provider is the AWS provider over the
// stateful EC2 fake (whose catalog ec2 holds).
func startAWSShard(t *testing.T, f *fixture, id string, ec2 *fake.EC2) {
	t.Helper()
	cfg, err := srvconfig.Parse([]byte(shardtest.Config(clusterID, id, "mock")))
	require.NoError(t, err)
	o := aws.DefaultOptions()
	o.ImageID = "ami-0123456789abcdef0"
	p := aws.New(ec2, *o, provider.Env{Config: func() *srvconfig.Config { return cfg }})
	sh := shardtest.Start(t, shardtest.Options{ClusterID: clusterID, ShardID: id, CA: f.ca, Provider: p, Log: logr.Discard()})
	f.shards[id] = &fakeShard{t: t, id: id, ca: f.ca, sh: sh, proxy: newProxy(t, sh.OperatorAddr)}
}

// autoscalerView reads an object's status.capacity and status.nodeInfo the
// way cluster-autoscaler's clusterapi provider does: unstructured, each
// capacity value parsed with resource.ParseQuantity.
func autoscalerView(t *testing.T, gvk, ns, name string) (map[string]string, map[string]string) {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(infrav1.GroupVersion.String())
	u.SetKind(gvk)
	if _, ok := getIn(t, env.Client, ns, name, u); !ok {
		return nil, nil
	}
	capMap, _, err := unstructured.NestedStringMap(u.Object, "status", "capacity")
	require.NoError(t, err)
	out := map[string]string{}
	for k, v := range capMap {
		q, err := resource.ParseQuantity(v)
		require.NoError(t, err, "capacity %s=%q", k, v)
		out[k] = q.String()
	}
	info, _, err := unstructured.NestedStringMap(u.Object, "status", "nodeInfo")
	require.NoError(t, err)
	return out, info
}

// TestScaleFromZeroCapacity: pools and a machine template at zero replicas
// publish the capacity of their instance type, from a shard's dev catalog
// (config instance_types) and from a shard whose AWS provider describes the
// type through the EC2 fake; the autoscaler reads exactly the type's shape.
func TestScaleFromZeroCapacity(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "s-dev")
	ec2 := fake.New("test-subnet-a")
	ec2.AddInstanceType(fake.InstanceType("g4dn.xlarge", 4, 16384, 1, 125, types.ArchitectureTypeX8664))
	ec2.AddInstanceType(fake.InstanceType("m7g.large", 2, 8192, 0, 0, types.ArchitectureTypeArm64))
	startAWSShard(t, f, "s-aws", ec2)
	f.putNonce(t)
	r := startOperator(t, f.options(t))
	r.waitImported(t)

	// The dev catalog: shardtest's config names test.small for the worker
	// template (2 vCPUs, 4096 MiB, 20 GiB ephemeral storage).
	f.createPool(t, "dev", 0, "s-dev")
	// AWS: the type comes from DescribeInstanceTypes on the fake.
	createZeroPool(t, f, "gpu", "g4dn.xlarge", "s-aws")
	// A pool over both shards: the first shard that answers decides.
	createZeroPool(t, f, "arm", "m7g.large", "s-aws", "s-dev")
	tmpl := &infrav1.NstanceMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "gpu-md"}}
	tmpl.Spec.Template.Spec = infrav1.NstanceMachineSpec{Group: "gpu-md", InstanceType: "g4dn.xlarge", Shard: "s-aws"}
	require.NoError(t, env.Client.Create(ctx, tmpl))
	devTmpl := &infrav1.NstanceMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: "dev-md"}}
	devTmpl.Spec.Template.Spec = infrav1.NstanceMachineSpec{Group: "dev-md", Template: "worker"}
	require.NoError(t, env.Client.Create(ctx, devTmpl))

	amd64 := map[string]string{"architecture": "amd64", "operatingSystem": "linux"}
	for _, tc := range []struct {
		kind, name string
		capacity   map[string]string
		nodeInfo   map[string]string
	}{
		{"NstanceMachinePool", "dev", map[string]string{"cpu": "2", "memory": "4Gi", "pods": "110", "ephemeral-storage": "20Gi"}, amd64},
		{"NstanceMachinePool", "gpu", map[string]string{"cpu": "4", "memory": "16Gi", "pods": "110", "ephemeral-storage": "116Gi", "nvidia.com/gpu": "1"}, amd64},
		{"NstanceMachinePool", "arm", map[string]string{"cpu": "2", "memory": "8Gi", "pods": "110"}, map[string]string{"architecture": "arm64", "operatingSystem": "linux"}},
		{"NstanceMachineTemplate", "gpu-md", map[string]string{"cpu": "4", "memory": "16Gi", "pods": "110", "ephemeral-storage": "116Gi", "nvidia.com/gpu": "1"}, amd64},
		{"NstanceMachineTemplate", "dev-md", map[string]string{"cpu": "2", "memory": "4Gi", "pods": "110", "ephemeral-storage": "20Gi"}, amd64},
	} {
		var capacity, info map[string]string
		require.Eventually(t, func() bool {
			capacity, info = autoscalerView(t, tc.kind, f.ns, tc.name)
			return len(capacity) > 0
		}, 30*time.Second, 100*time.Millisecond, "%s %s publishes no capacity", tc.kind, tc.name)
		require.Equal(t, tc.capacity, capacity, "%s %s", tc.kind, tc.name)
		require.Equal(t, tc.nodeInfo, info, "%s %s", tc.kind, tc.name)
	}
	// Each type was described once: the server's provider caches it (and
	// the operator's catalog caches the shard's answer).
	require.Equal(t, 2, ec2.Calls(fake.OpDescribeInstanceTypes))
	// Nothing was started to learn it.
	require.Empty(t, ec2.Instances())
}

// createZeroPool creates a pool of an explicit instance type at zero
// replicas (the MachinePool's bootstrap data is ready).
func createZeroPool(t *testing.T, f *fixture, name, instanceType string, shards ...string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, env.Client.Create(ctx, &infrav1.NstanceMachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec:       infrav1.NstanceMachinePoolSpec{Group: name, Shards: shards, Template: "worker", InstanceType: instanceType},
	}))
	require.NoError(t, env.Client.Create(ctx, &clusterv1.MachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name},
		Spec: clusterv1.MachinePoolSpec{
			ClusterName: clusterID, Replicas: ptr.To(int32(0)),
			Template: clusterv1.MachineTemplateSpec{Spec: clusterv1.MachineSpec{
				ClusterName: clusterID, Bootstrap: clusterv1.Bootstrap{DataSecretName: ptr.To("")},
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{
					APIGroup: infrav1.GroupVersion.Group, Kind: "NstanceMachinePool", Name: name,
				},
			}},
		},
	}))
}
