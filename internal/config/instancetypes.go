package config

import (
	"slices"
)

// Architectures and operating systems an instance_types entry may name
// (those cluster-autoscaler's scale from zero knows).
var (
	InstanceTypeArchs = []string{"amd64", "arm64", "s390x", "ppc64le"}
	InstanceTypeOSes  = []string{"linux", "windows"}
)

// WithDefaults fills the entry's defaults: 110 pods, amd64, linux.
func (t InstanceType) WithDefaults() InstanceType {
	if t.Pods == 0 {
		t.Pods = 110
	}
	if t.Arch == "" {
		t.Arch = "amd64"
	}
	if t.OS == "" {
		t.OS = "linux"
	}
	return t
}

func checkInstanceTypes(ch *checker, types map[string]InstanceType) {
	for name, t := range types {
		key := "instance_types." + name
		if name == "" {
			ch.add("instance_types", "an entry has an empty name")
		}
		if t.VCPUs <= 0 {
			ch.add(key+".vcpus", "must be positive, got %d", t.VCPUs)
		}
		if t.MemoryMiB <= 0 {
			ch.add(key+".memory_mib", "must be positive, got %d", t.MemoryMiB)
		}
		if t.GPUs < 0 {
			ch.add(key+".gpus", "must not be negative, got %d", t.GPUs)
		}
		if t.EphemeralStorageGiB < 0 {
			ch.add(key+".ephemeral_storage_gib", "must not be negative, got %d", t.EphemeralStorageGiB)
		}
		if t.Pods < 0 {
			ch.add(key+".pods", "must not be negative, got %d", t.Pods)
		}
		if t.Arch != "" && !slices.Contains(InstanceTypeArchs, t.Arch) {
			ch.add(key+".arch", "must be one of %v, got %q", InstanceTypeArchs, t.Arch)
		}
		if t.OS != "" && !slices.Contains(InstanceTypeOSes, t.OS) {
			ch.add(key+".os", "must be one of %v, got %q", InstanceTypeOSes, t.OS)
		}
	}
}
