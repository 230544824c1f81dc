package config

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func withInstanceTypes(block string) string {
	i := strings.LastIndex(minimal, "}")
	return minimal[:i] + `"instance_types": ` + block + ",\n}"
}

func TestInstanceTypesCatalog(t *testing.T) {
	cfg, err := Parse([]byte(withInstanceTypes(`{"dev.gpu": {"vcpus": 4, "memory_mib": 16384, "gpus": 1, "ephemeral_storage_gib": 100, "arch": "arm64"}}`)))
	require.NoError(t, err)
	require.Equal(t, InstanceType{VCPUs: 4, MemoryMiB: 16384, GPUs: 1, EphemeralStorageGiB: 100, Pods: 110, Arch: "arm64", OS: "linux"},
		cfg.InstanceTypes["dev.gpu"].WithDefaults())

	for _, tc := range []struct{ block, want string }{
		{`{"x": {"memory_mib": 1}}`, "instance_types.x.vcpus: must be positive"},
		{`{"x": {"vcpus": 1}}`, "instance_types.x.memory_mib: must be positive"},
		{`{"x": {"vcpus": 1, "memory_mib": 1, "gpus": -1}}`, "instance_types.x.gpus: must not be negative"},
		{`{"x": {"vcpus": 1, "memory_mib": 1, "ephemeral_storage_gib": -1}}`, "instance_types.x.ephemeral_storage_gib: must not be negative"},
		{`{"x": {"vcpus": 1, "memory_mib": 1, "pods": -1}}`, "instance_types.x.pods: must not be negative"},
		{`{"x": {"vcpus": 1, "memory_mib": 1, "arch": "x86_64"}}`, "instance_types.x.arch: must be one of"},
		{`{"x": {"vcpus": 1, "memory_mib": 1, "os": "darwin"}}`, "instance_types.x.os: must be one of"},
		{`{"x": {"vcpus": 1, "memory_mib": 1, "cpu": 2}}`, "cpu"},
	} {
		_, err := Parse([]byte(withInstanceTypes(tc.block)))
		require.ErrorContains(t, err, tc.want, tc.block)
	}
}
