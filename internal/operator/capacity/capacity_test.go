package capacity_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	clocktesting "k8s.io/utils/clock/testing"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
	"github.com/nstance-dev/nstance/internal/operator/capacity"
	nstancev1 "github.com/nstance-dev/nstance/pkg/proto/nstance/v1"
)

func TestOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   *nstancev1.InstanceTypeInfo
		want map[corev1.ResourceName]string
		node infrav1.NodeInfo
	}{
		{"EBS-only amd64: no ephemeral-storage, no GPU",
			&nstancev1.InstanceTypeInfo{Vcpus: 2, MemoryMib: 8192, Pods: 110, Architecture: "amd64", OperatingSystem: "linux"},
			map[corev1.ResourceName]string{"cpu": "2", "memory": "8Gi", "pods": "110"}, infrav1.NodeInfo{Architecture: "amd64", OperatingSystem: "linux"}},
		{"GPU and instance store",
			&nstancev1.InstanceTypeInfo{Vcpus: 4, MemoryMib: 16384, Gpus: 1, EphemeralStorageGib: 116, Pods: 110, Architecture: "amd64", OperatingSystem: "linux"},
			map[corev1.ResourceName]string{"cpu": "4", "memory": "16Gi", "pods": "110", "ephemeral-storage": "116Gi", "nvidia.com/gpu": "1"},
			infrav1.NodeInfo{Architecture: "amd64", OperatingSystem: "linux"}},
		{"memory not a whole GiB stays exact",
			&nstancev1.InstanceTypeInfo{Vcpus: 1, MemoryMib: 1536, Pods: 8, Architecture: "arm64", OperatingSystem: "linux"},
			map[corev1.ResourceName]string{"cpu": "1", "memory": "1536Mi", "pods": "8"}, infrav1.NodeInfo{Architecture: "arm64", OperatingSystem: "linux"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rl, ni := capacity.Of(tc.in)
			got := map[corev1.ResourceName]string{}
			for k, v := range rl {
				got[k] = v.String()
				// The autoscaler parses each value with resource.ParseQuantity.
				_, err := resource.ParseQuantity(v.String())
				require.NoError(t, err)
			}
			require.Equal(t, tc.want, got)
			require.Equal(t, tc.node, ni)
		})
	}
}

type shards struct {
	calls   map[string]int
	answers map[string]*nstancev1.InstanceTypeInfo
}

func (s *shards) Describe(_ context.Context, shard string, req *nstancev1.DescribeInstanceTypeRequest) (*nstancev1.InstanceTypeInfo, error) {
	s.calls[shard]++
	if a, ok := s.answers[shard]; ok {
		return a, nil
	}
	return nil, errors.New("unavailable")
}

func TestCatalog(t *testing.T) {
	small := &nstancev1.InstanceTypeInfo{Name: "small", Vcpus: 2, MemoryMib: 2048, Pods: 110}
	s := &shards{calls: map[string]int{}, answers: map[string]*nstancev1.InstanceTypeInfo{"b": small}}
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	c := &capacity.Catalog{Shards: s, TTL: time.Minute, Clock: clk}
	ctx := context.Background()
	l := capacity.Lookup{Template: "worker"}

	// a is down: b answers.
	got, err := c.Describe(ctx, []string{"a", "b"}, l)
	require.NoError(t, err)
	require.Equal(t, small, got)
	// Cached within the TTL: b is not asked again (a, failing, is).
	_, err = c.Describe(ctx, []string{"a", "b"}, l)
	require.NoError(t, err)
	require.Equal(t, map[string]int{"a": 2, "b": 1}, s.calls)
	// After the TTL b is asked again.
	clk.Step(time.Minute)
	_, err = c.Describe(ctx, []string{"b"}, l)
	require.NoError(t, err)
	require.Equal(t, 2, s.calls["b"])
	// Nobody answers: both errors.
	_, err = c.Describe(ctx, []string{"a", "c"}, l)
	require.ErrorContains(t, err, "shard a: unavailable")
	require.ErrorContains(t, err, "shard c: unavailable")
	_, err = c.Describe(ctx, nil, l)
	require.Error(t, err)
}

func TestSetPool(t *testing.T) {
	s := &shards{calls: map[string]int{}, answers: map[string]*nstancev1.InstanceTypeInfo{
		"b": {Vcpus: 2, MemoryMib: 2048, Pods: 110, Architecture: "arm64", OperatingSystem: "linux"}}}
	c := &capacity.Catalog{Shards: s}
	ctx := context.Background()

	pool := &infrav1.NstanceMachinePool{Spec: infrav1.NstanceMachinePoolSpec{Shards: []string{"a", "b"}, Template: "worker"}}
	capacity.SetPool(ctx, c, pool)
	require.Equal(t, "2", pool.Status.Capacity.Cpu().String())
	require.Equal(t, "2Gi", pool.Status.Capacity.Memory().String())
	require.Equal(t, infrav1.NodeInfo{Architecture: "arm64", OperatingSystem: "linux"}, pool.Status.NodeInfo)

	// No shard answers: what the pool had stays.
	down := &infrav1.NstanceMachinePool{Spec: infrav1.NstanceMachinePoolSpec{Shards: []string{"a"}, Template: "worker"}}
	down.Status = pool.Status
	capacity.SetPool(ctx, c, down)
	require.Equal(t, pool.Status.Capacity, down.Status.Capacity)

	// Neither template nor instance type: nothing asked.
	calls := s.calls["a"] + s.calls["b"]
	capacity.SetPool(ctx, c, &infrav1.NstanceMachinePool{Spec: infrav1.NstanceMachinePoolSpec{Shards: []string{"a", "b"}}})
	require.Equal(t, calls, s.calls["a"]+s.calls["b"])
	capacity.SetPool(ctx, nil, pool) // a nil catalog is a no-op
}

func TestSetTemplateAsksItsShard(t *testing.T) {
	s := &shards{calls: map[string]int{}, answers: map[string]*nstancev1.InstanceTypeInfo{
		"a": {Vcpus: 1, MemoryMib: 1024, Pods: 110}, "b": {Vcpus: 8, MemoryMib: 32768, Pods: 110}}}
	c := &capacity.Catalog{Shards: s}
	tmpl := &infrav1.NstanceMachineTemplate{}
	tmpl.Spec.Template.Spec = infrav1.NstanceMachineSpec{InstanceType: "big", Shard: "b"}
	require.NoError(t, capacity.SetTemplate(context.Background(), c, tmpl, []string{"a", "b"}))
	require.Equal(t, "8", tmpl.Status.Capacity.Cpu().String())
	require.Equal(t, map[string]int{"b": 1}, s.calls)
}
