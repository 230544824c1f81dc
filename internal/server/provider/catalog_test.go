package provider_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/config"
	"github.com/nstance-dev/nstance/internal/server/provider"
)

type describer map[string]provider.InstanceType

func (d describer) DescribeInstanceType(_ context.Context, name string) (provider.InstanceType, error) {
	if t, ok := d[name]; ok {
		return t, nil
	}
	return provider.InstanceType{}, fmt.Errorf("lookup %s: %w", name, provider.ErrUnknownInstanceType)
}

func TestCatalog(t *testing.T) {
	cfg := &config.Config{InstanceTypes: map[string]config.InstanceType{
		"dev.small": {VCPUs: 2, MemoryMiB: 2048},
		"m5.large":  {VCPUs: 2, MemoryMiB: 7000, Pods: 29, Arch: "amd64", OS: "linux"},
	}}
	cloud := describer{
		"m5.large":  {Name: "m5.large", VCPUs: 2, MemoryMiB: 8192, Pods: 110, Architecture: "amd64", OperatingSystem: "linux"},
		"t4g.small": {Name: "t4g.small", VCPUs: 2, MemoryMiB: 2048, Architecture: "arm64", OperatingSystem: "linux"},
	}
	for _, tc := range []struct {
		name    string
		c       provider.Catalog
		lookup  string
		want    provider.InstanceType
		unknown bool
	}{
		{"config entry with defaults", provider.Catalog{Config: func() *config.Config { return cfg }}, "dev.small",
			provider.InstanceType{Name: "dev.small", VCPUs: 2, MemoryMiB: 2048, Pods: 110, Architecture: "amd64", OperatingSystem: "linux"}, false},
		{"config overrides the provider", provider.Catalog{Config: func() *config.Config { return cfg }, Provider: cloud}, "m5.large",
			provider.InstanceType{Name: "m5.large", VCPUs: 2, MemoryMiB: 7000, Pods: 29, Architecture: "amd64", OperatingSystem: "linux"}, false},
		{"provider fills what the config lacks, pods defaulted", provider.Catalog{Config: func() *config.Config { return cfg }, Provider: cloud}, "t4g.small",
			provider.InstanceType{Name: "t4g.small", VCPUs: 2, MemoryMiB: 2048, Pods: 110, Architecture: "arm64", OperatingSystem: "linux"}, false},
		{"unknown to both", provider.Catalog{Config: func() *config.Config { return cfg }, Provider: cloud}, "x9.huge", provider.InstanceType{}, true},
		{"no provider lookup", provider.Catalog{Config: func() *config.Config { return cfg }}, "t4g.small", provider.InstanceType{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.c.DescribeInstanceType(context.Background(), tc.lookup)
			if tc.unknown {
				require.ErrorIs(t, err, provider.ErrUnknownInstanceType)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}
