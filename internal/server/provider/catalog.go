package provider

import (
	"context"
	"fmt"

	"github.com/nstance-dev/nstance/internal/config"
)

// Catalog answers instance-type lookups: the config's instance_types first
// (the only source of the local providers, and an override for a cloud's),
// then the provider's own lookup when it has one.
type Catalog struct {
	// Config returns the running config.
	Config func() *config.Config
	// Provider looks up types the config does not name; nil: none.
	Provider InstanceTypeDescriber
}

// DescribeInstanceType implements InstanceTypeDescriber.
func (c Catalog) DescribeInstanceType(ctx context.Context, name string) (InstanceType, error) {
	if c.Config != nil {
		if t, ok := c.Config().InstanceTypes[name]; ok {
			t = t.WithDefaults()
			return InstanceType{Name: name, VCPUs: t.VCPUs, MemoryMiB: t.MemoryMiB, GPUs: t.GPUs, EphemeralStorageGiB: t.EphemeralStorageGiB,
				Pods: t.Pods, Architecture: t.Arch, OperatingSystem: t.OS}, nil
		}
	}
	if c.Provider == nil {
		return InstanceType{}, fmt.Errorf("instance type %q: %w: not in the config's instance_types and the provider has no lookup", name, ErrUnknownInstanceType)
	}
	it, err := c.Provider.DescribeInstanceType(ctx, name)
	if err != nil {
		return InstanceType{}, err
	}
	if it.Pods == 0 {
		it.Pods = DefaultMaxPods
	}
	return it, nil
}
