package fake

import (
	"context"
	"fmt"

	awssdk "github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// AddInstanceType makes EC2 offer a type: DescribeInstanceTypes answers it.
func (f *EC2) AddInstanceType(t types.InstanceTypeInfo) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.types[t.InstanceType] = t
}

// HoldInstanceTypes makes DescribeInstanceTypes calls (counted at once)
// wait until release is called: a slow EC2 for tests of concurrent callers.
func (f *EC2) HoldInstanceTypes() (release func()) {
	gate := make(chan struct{})
	f.mu.Lock()
	f.typesGate = gate
	f.mu.Unlock()
	return func() {
		f.mu.Lock()
		f.typesGate = nil
		f.mu.Unlock()
		close(gate)
	}
}

// InstanceType is a convenience builder of the parts of an
// InstanceTypeInfo the provider reads: vCPUs, memory in MiB, NVIDIA GPUs,
// instance store in GB (0: EBS only) and one architecture (x86_64, arm64).
func InstanceType(name string, vcpus int32, memMiB int64, gpus int32, storeGB int64, arch types.ArchitectureType) types.InstanceTypeInfo {
	t := types.InstanceTypeInfo{
		InstanceType:  types.InstanceType(name),
		VCpuInfo:      &types.VCpuInfo{DefaultVCpus: awssdk.Int32(vcpus)},
		MemoryInfo:    &types.MemoryInfo{SizeInMiB: awssdk.Int64(memMiB)},
		ProcessorInfo: &types.ProcessorInfo{SupportedArchitectures: []types.ArchitectureType{arch}},
	}
	if gpus > 0 {
		t.GpuInfo = &types.GpuInfo{Gpus: []types.GpuDeviceInfo{{Count: awssdk.Int32(gpus), Manufacturer: awssdk.String("NVIDIA"), Name: awssdk.String("T4")}}}
	}
	if storeGB > 0 {
		t.InstanceStorageSupported = awssdk.Bool(true)
		t.InstanceStorageInfo = &types.InstanceStorageInfo{TotalSizeInGB: awssdk.Int64(storeGB)}
	}
	return t
}

// DescribeInstanceTypes answers the types added with AddInstanceType. As
// EC2 does, one unknown name fails the whole call with InvalidInstanceType;
// no names lists every type.
func (f *EC2) DescribeInstanceTypes(ctx context.Context, in *ec2.DescribeInstanceTypesInput, _ ...func(*ec2.Options)) (*ec2.DescribeInstanceTypesOutput, error) {
	f.mu.Lock()
	if err := f.enter(OpDescribeInstanceTypes); err != nil {
		f.mu.Unlock()
		return nil, err
	}
	gate := f.typesGate
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := &ec2.DescribeInstanceTypesOutput{}
	if len(in.InstanceTypes) == 0 {
		for _, t := range f.types {
			out.InstanceTypes = append(out.InstanceTypes, t)
		}
		return out, f.leave(OpDescribeInstanceTypes)
	}
	for _, name := range in.InstanceTypes {
		t, ok := f.types[name]
		if !ok {
			return nil, apiError("InvalidInstanceType", fmt.Sprintf("The following supplied instance types do not exist: [%s]", name))
		}
		out.InstanceTypes = append(out.InstanceTypes, t)
	}
	return out, f.leave(OpDescribeInstanceTypes)
}
