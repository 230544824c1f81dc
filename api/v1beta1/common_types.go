package v1beta1

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition types shared by the Nstance kinds. Conditions are plain
// metav1.Condition values, as the Cluster API v1beta2 contract expects.
const (
	// ReadyCondition summarises whether the object is fully reconciled and
	// its instances are serving.
	ReadyCondition = "Ready"

	// ShardReachableCondition reports whether the operator can talk to the
	// nstance-server of the shard the object lives in.
	ShardReachableCondition = "ShardReachable"

	// ConfigValidCondition reports whether the server accepted the group
	// configuration derived from the object.
	ConfigValidCondition = "ConfigValid"

	// InstanceProvisionedCondition reports whether the server created the
	// instance behind an NstanceMachine.
	InstanceProvisionedCondition = "InstanceProvisioned"
)

// Condition reasons. Each is a CamelCase word as metav1.Condition requires.
const (
	// SyncedReason: the desired state was pushed to the server and confirmed.
	SyncedReason = "Synced"
	// SyncFailedReason: pushing the desired state to the server failed.
	SyncFailedReason = "SyncFailed"
	// WaitingForReplicasReason: fewer instances are ready than requested.
	WaitingForReplicasReason = "WaitingForReplicas"
	// ShardConnectedReason: the shard's server answered.
	ShardConnectedReason = "ShardConnected"
	// ShardUnreachableReason: the shard's server could not be reached.
	ShardUnreachableReason = "ShardUnreachable"
	// UnknownShardReason: the shard is not in the operator configuration.
	UnknownShardReason = "UnknownShard"
	// ConfigAcceptedReason: the server accepted the group configuration.
	ConfigAcceptedReason = "ConfigAccepted"
	// ConfigRejectedReason: the server rejected the group configuration.
	ConfigRejectedReason = "ConfigRejected"
	// ProvisioningReason: the instance is being created.
	ProvisioningReason = "Provisioning"
	// InstanceRunningReason: the instance is running.
	InstanceRunningReason = "InstanceRunning"
	// InstanceFailedReason: the instance could not be created or failed.
	InstanceFailedReason = "InstanceFailed"
	// PausedReason: reconciliation is paused (cluster.x-k8s.io/paused).
	PausedReason = "Paused"
	// DeletingReason: the object is being deleted.
	DeletingReason = "Deleting"
	// WaitingForBootstrapDataReason: the owning Machine's (or MachinePool
	// template's) spec.bootstrap.dataSecretName is not set yet, so nothing
	// is created or changed on the servers.
	WaitingForBootstrapDataReason = "WaitingForBootstrapData"
	// BootstrapDataSecretNotFoundReason: the named bootstrap data Secret
	// does not exist.
	BootstrapDataSecretNotFoundReason = "BootstrapDataSecretNotFound"
	// BootstrapDataSecretInvalidReason: the bootstrap data Secret lacks a
	// non-empty "value" or names an unknown "format".
	BootstrapDataSecretInvalidReason = "BootstrapDataSecretInvalid"
	// BootstrapDataRejectedReason: the server refused the request carrying
	// the bootstrap data (too large, for one).
	BootstrapDataRejectedReason = "BootstrapDataRejected"
)

// Finalizers the operator places on the Nstance kinds.
const (
	ClusterFinalizer     = "nstancecluster.infrastructure.cluster.x-k8s.io"
	MachinePoolFinalizer = "nstancemachinepool.infrastructure.cluster.x-k8s.io"
	ShardGroupFinalizer  = "nstanceshardgroup.infrastructure.cluster.x-k8s.io"
	MachineFinalizer     = "nstancemachine.infrastructure.cluster.x-k8s.io"
)

// AbandonInstancesAnnotation, set to "true" on a Cluster, lets its deletion
// finish while a shard server cannot be reached (or is no longer in the
// operator configuration): every finalizer that waits on such a shard
// (NstanceCluster, NstanceShardGroup, NstanceMachine) is released, and an
// Event names the groups and instances left behind on it. Reachable shards
// are still cleaned up as usual.
const AbandonInstancesAnnotation = "nstance.dev/abandon-instances"

// Labels the operator sets on objects it creates.
const (
	// GroupLabel carries the Nstance group name.
	GroupLabel = "nstance.dev/group"
	// ShardLabel carries the shard ID.
	ShardLabel = "nstance.dev/shard"
)

// shardGroupSeparator joins a group and a shard into an NstanceShardGroup
// name. Group names cannot contain it (see the group pattern), so a name
// splits back unambiguously.
const shardGroupSeparator = "--"

// ShardGroupName is the name of the NstanceShardGroup holding the part of
// group that runs in shard.
func ShardGroupName(group, shard string) string {
	return group + shardGroupSeparator + shard
}

// ParseShardGroupName splits a name made by ShardGroupName. ok is false when
// name has no separator or either part is empty.
func ParseShardGroupName(name string) (group, shard string, ok bool) {
	group, shard, found := strings.Cut(name, shardGroupSeparator)
	if !found || group == "" || shard == "" {
		return "", "", false
	}
	return group, shard, true
}

// InitializationStatus is the v1beta2 contract's status.initialization block.
type InitializationStatus struct {
	// provisioned is true once the infrastructure is provisioned. Cluster API
	// reads it to move the owning object forward; it never goes back to false.
	// +optional
	Provisioned *bool `json:"provisioned,omitempty"`
}

// APIEndpoint is a host and port serving the Kubernetes API.
type APIEndpoint struct {
	// host is the DNS name or IP address of the API server.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	Host string `json:"host,omitempty"`

	// port is the TCP port of the API server.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	Port int32 `json:"port,omitempty"`
}

// IsZero reports whether neither host nor port is set.
func (e APIEndpoint) IsZero() bool { return e.Host == "" && e.Port == 0 }

// FailureDomain describes one shard to Cluster API. It has the shape of the
// v1beta2 contract's status.failureDomains entries.
type FailureDomain struct {
	// name is the failure domain name: the shard ID.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Name string `json:"name"`

	// controlPlane tells whether control plane machines may be placed here.
	// +optional
	ControlPlane *bool `json:"controlPlane,omitempty"`

	// attributes are free-form details about the failure domain.
	// +optional
	Attributes map[string]string `json:"attributes,omitempty"`
}

// MachineAddressType names the kind of a machine address.
// +kubebuilder:validation:Enum=Hostname;ExternalIP;InternalIP;ExternalDNS;InternalDNS
type MachineAddressType string

// Address types, the same set Cluster API uses.
const (
	MachineHostName    MachineAddressType = "Hostname"
	MachineExternalIP  MachineAddressType = "ExternalIP"
	MachineInternalIP  MachineAddressType = "InternalIP"
	MachineExternalDNS MachineAddressType = "ExternalDNS"
	MachineInternalDNS MachineAddressType = "InternalDNS"
)

// MachineAddress is one address of an instance, shaped like Cluster API's
// MachineAddress.
type MachineAddress struct {
	// type of the address.
	// +required
	Type MachineAddressType `json:"type"`

	// address is the value: an IP address or a host name.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Address string `json:"address"`
}

// ObjectMeta is the part of object metadata a template may carry over to
// the objects made from it.
type ObjectMeta struct {
	// labels to set on objects made from the template.
	// +optional
	Labels map[string]string `json:"labels,omitempty"`

	// annotations to set on objects made from the template.
	// +optional
	Annotations map[string]string `json:"annotations,omitempty"`
}

// conditionsHolder is implemented by every Nstance kind.
type conditionsHolder interface {
	GetConditions() []metav1.Condition
	SetConditions([]metav1.Condition)
}

var (
	_ conditionsHolder = &NstanceCluster{}
	_ conditionsHolder = &NstanceMachinePool{}
	_ conditionsHolder = &NstanceShardGroup{}
	_ conditionsHolder = &NstanceMachine{}
	_ conditionsHolder = &NstanceMachineTemplate{}
)

// Architecture is the CPU architecture of a node, in Kubernetes' naming.
// +kubebuilder:validation:Enum=amd64;arm64;s390x;ppc64le
type Architecture string

// NodeInfo is the architecture and operating system of the nodes a
// template or pool makes, for cluster-autoscaler's scale from zero (the
// Cluster API "Opt-in Autoscaling from Zero" contract).
// +kubebuilder:validation:MinProperties=1
type NodeInfo struct {
	// architecture is the CPU architecture of the node: amd64, arm64, s390x
	// or ppc64le.
	// +optional
	Architecture Architecture `json:"architecture,omitempty"`

	// operatingSystem is the node's operating system, e.g. linux or windows.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	OperatingSystem string `json:"operatingSystem,omitempty"`
}
