package aws_test

import (
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/server/provider"
	"github.com/nstance-dev/nstance/internal/server/provider/aws"
	"github.com/nstance-dev/nstance/internal/server/provider/aws/fake"
)

func TestInstanceTypeOf(t *testing.T) {
	amd := types.ArchitectureTypeX8664
	for _, tc := range []struct {
		name string
		in   types.InstanceTypeInfo
		want provider.InstanceType
	}{
		{"EBS only, amd64", fake.InstanceType("m5.large", 2, 8192, 0, 0, amd),
			provider.InstanceType{Name: "m5.large", VCPUs: 2, MemoryMiB: 8192, Pods: 110, Architecture: "amd64", OperatingSystem: "linux"}},
		{"arm64", fake.InstanceType("t4g.medium", 2, 4096, 0, 0, types.ArchitectureTypeArm64),
			provider.InstanceType{Name: "t4g.medium", VCPUs: 2, MemoryMiB: 4096, Pods: 110, Architecture: "arm64", OperatingSystem: "linux"}},
		{"GPU and instance store (GB to GiB, rounded down)", fake.InstanceType("g4dn.xlarge", 4, 16384, 1, 125, amd),
			provider.InstanceType{Name: "g4dn.xlarge", VCPUs: 4, MemoryMiB: 16384, GPUs: 1, EphemeralStorageGiB: 116, Pods: 110, Architecture: "amd64", OperatingSystem: "linux"}},
		{"first Kubernetes architecture wins over i386", types.InstanceTypeInfo{InstanceType: "c1.medium",
			ProcessorInfo: &types.ProcessorInfo{SupportedArchitectures: []types.ArchitectureType{types.ArchitectureTypeI386, amd}}},
			provider.InstanceType{Name: "c1.medium", Pods: 110, Architecture: "amd64", OperatingSystem: "linux"}},
		{"other GPU makers are not nvidia.com/gpu", func() types.InstanceTypeInfo {
			t := fake.InstanceType("g4ad.xlarge", 4, 16384, 1, 0, amd)
			m := "AMD"
			t.GpuInfo.Gpus[0].Manufacturer = &m
			return t
		}(), provider.InstanceType{Name: "g4ad.xlarge", VCPUs: 4, MemoryMiB: 16384, Pods: 110, Architecture: "amd64", OperatingSystem: "linux"}},
	} {
		t.Run(tc.name, func(t *testing.T) { require.Equal(t, tc.want, aws.InstanceTypeOf(tc.in)) })
	}
}

func TestDescribeInstanceTypeCached(t *testing.T) {
	h := newHarness(t, nil)
	h.ec2.AddInstanceType(fake.InstanceType("m7g.large", 2, 8192, 0, 0, types.ArchitectureTypeArm64))
	ctx := t.Context()

	// A throttled lookup fails and is not cached.
	h.ec2.Throttle(fake.OpDescribeInstanceTypes, 1)
	_, err := h.p.DescribeInstanceType(ctx, "m7g.large")
	require.ErrorContains(t, err, "RequestLimitExceeded")

	for range 3 {
		it, err := h.p.DescribeInstanceType(ctx, "m7g.large")
		require.NoError(t, err)
		require.Equal(t, provider.InstanceType{Name: "m7g.large", VCPUs: 2, MemoryMiB: 8192, Pods: 110, Architecture: "arm64", OperatingSystem: "linux"}, it)
	}
	require.Equal(t, 2, h.ec2.Calls(fake.OpDescribeInstanceTypes), "one failed call, then one answer cached")

	_, err = h.p.DescribeInstanceType(ctx, "x9.huge")
	require.ErrorIs(t, err, provider.ErrUnknownInstanceType)
}

func TestDescribeInstanceTypeConcurrentLookupsShareOneCall(t *testing.T) {
	h := newHarness(t, nil)
	h.ec2.AddInstanceType(fake.InstanceType("m7g.large", 2, 8192, 0, 0, types.ArchitectureTypeArm64))
	ctx := t.Context()
	// EC2 is slow: the first lookup is held while the others arrive.
	release := h.ec2.HoldInstanceTypes()
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = h.p.DescribeInstanceType(ctx, "m7g.large")
		})
	}
	require.Eventually(t, func() bool { return h.ec2.Calls(fake.OpDescribeInstanceTypes) >= 1 }, 5*time.Second, time.Millisecond)
	// Give the other lookups time to reach the provider (a separate call
	// each would be counted by then); the assertion holds whatever the
	// timing when they share the call.
	time.Sleep(50 * time.Millisecond)
	release()
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, 1, h.ec2.Calls(fake.OpDescribeInstanceTypes), "lookups racing before the cache is filled share a call")
}
