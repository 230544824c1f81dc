package provider

import (
	"context"
	"errors"
)

// ErrUnknownInstanceType reports that no catalog knows the instance type.
var ErrUnknownInstanceType = errors.New("unknown instance type")

// DefaultMaxPods is the pod capacity a node reports when the catalog gives
// none: the kubelet's default --max-pods.
const DefaultMaxPods = 110

// InstanceType is what one machine of an instance type offers a Kubernetes
// node: the capacity the cluster autoscaler assumes when it scales a pool up
// from zero.
type InstanceType struct {
	Name string
	// VCPUs and MemoryMiB are the machine's CPUs and memory.
	VCPUs     int32
	MemoryMiB int64
	// GPUs counts NVIDIA GPUs (the node's nvidia.com/gpu).
	GPUs int32
	// EphemeralStorageGiB is local storage for pods (0: not known).
	EphemeralStorageGiB int64
	// Pods is the node's pod capacity (0: DefaultMaxPods).
	Pods int32
	// Architecture is the Kubernetes GOARCH name (amd64, arm64, ...);
	// OperatingSystem the GOOS name (linux, windows).
	Architecture    string
	OperatingSystem string
}

// InstanceTypeDescriber is implemented by providers that can look up an
// instance type (AWS: DescribeInstanceTypes). The local providers have none:
// their types come from the config's instance_types catalog. It returns
// ErrUnknownInstanceType (wrapped) for a type it does not know.
type InstanceTypeDescriber interface {
	DescribeInstanceType(ctx context.Context, name string) (InstanceType, error)
}
