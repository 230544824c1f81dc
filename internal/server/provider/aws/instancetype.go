package aws

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/nstance-dev/nstance/internal/server/provider"
)

// codeInvalidInstanceType is EC2's answer to a type it does not offer.
const codeInvalidInstanceType = "InvalidInstanceType"

var _ provider.InstanceTypeDescriber = (*Provider)(nil)

// DescribeInstanceType looks the type up with DescribeInstanceTypes once and
// caches the answer for the provider's life: an instance type's shape never
// changes. Failures are not cached.
func (p *Provider) DescribeInstanceType(ctx context.Context, name string) (provider.InstanceType, error) {
	p.mu.Lock()
	it, ok := p.types[name]
	p.mu.Unlock()
	if ok {
		return it, nil
	}
	// Concurrent lookups of one type share a single call.
	v, err, _ := p.typeCalls.Do(name, func() (any, error) {
		out, err := p.api.DescribeInstanceTypes(ctx, &ec2.DescribeInstanceTypesInput{InstanceTypes: []types.InstanceType{types.InstanceType(name)}})
		if errorCode(err) == codeInvalidInstanceType {
			return nil, fmt.Errorf("describe instance type %s: %w: %w", name, provider.ErrUnknownInstanceType, err)
		}
		if err != nil {
			return nil, fmt.Errorf("describe instance type %s: %w", name, err)
		}
		i := slices.IndexFunc(out.InstanceTypes, func(t types.InstanceTypeInfo) bool { return string(t.InstanceType) == name })
		if i < 0 {
			return nil, fmt.Errorf("describe instance type %s: %w", name, provider.ErrUnknownInstanceType)
		}
		it := InstanceTypeOf(out.InstanceTypes[i])
		p.mu.Lock()
		p.types[name] = it
		p.mu.Unlock()
		return it, nil
	})
	if err != nil {
		return provider.InstanceType{}, err
	}
	return v.(provider.InstanceType), nil
}

// InstanceTypeOf converts EC2's description of a type: its default vCPUs,
// memory, NVIDIA GPUs, instance store (the node's ephemeral storage when the
// type has one; an EBS-only type reports none) and the first architecture
// it supports in Kubernetes' naming. Nstance runs Linux on EC2.
func InstanceTypeOf(t types.InstanceTypeInfo) provider.InstanceType {
	it := provider.InstanceType{Name: string(t.InstanceType), OperatingSystem: "linux", Pods: provider.DefaultMaxPods}
	if t.VCpuInfo != nil && t.VCpuInfo.DefaultVCpus != nil {
		it.VCPUs = *t.VCpuInfo.DefaultVCpus
	}
	if t.MemoryInfo != nil && t.MemoryInfo.SizeInMiB != nil {
		it.MemoryMiB = *t.MemoryInfo.SizeInMiB
	}
	if t.GpuInfo != nil {
		for _, g := range t.GpuInfo.Gpus {
			if g.Manufacturer != nil && strings.EqualFold(*g.Manufacturer, "NVIDIA") && g.Count != nil {
				it.GPUs += *g.Count
			}
		}
	}
	if t.InstanceStorageInfo != nil && t.InstanceStorageInfo.TotalSizeInGB != nil {
		// EC2 counts instance store in GB (10^9 bytes); report whole GiB,
		// rounding down so the autoscaler never assumes more than there is.
		it.EphemeralStorageGiB = *t.InstanceStorageInfo.TotalSizeInGB * 1000 * 1000 * 1000 / (1 << 30)
	}
	if t.ProcessorInfo != nil {
		for _, a := range t.ProcessorInfo.SupportedArchitectures {
			switch a {
			case types.ArchitectureTypeX8664:
				it.Architecture = "amd64"
			case types.ArchitectureTypeArm64:
				it.Architecture = "arm64"
			default:
				continue
			}
			break
		}
	}
	return it
}
