package v1beta1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NstanceMachinePoolSpec is the desired state of an NstanceMachinePool. The
// replica count is not here: it is the owning MachinePool's spec.replicas.
type NstanceMachinePoolSpec struct {
	// group is the Nstance group name used on every shard. It is a DNS label
	// without consecutive dashes, so that "{group}--{shard}" names split back
	// unambiguously. It cannot change.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]+(-[a-z0-9]+)*$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="group is immutable"
	Group string `json:"group"`

	// shards the pool spreads its replicas over, in the order that receives
	// the remainder of an uneven split first.
	// +required
	// +listType=set
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=63
	// +kubebuilder:validation:items:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Shards []string `json:"shards"`

	// template names the server-side instance template.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Template string `json:"template,omitempty"`

	// instanceType is the provider instance type, e.g. "m7i.large".
	// +optional
	// +kubebuilder:validation:MaxLength=128
	InstanceType string `json:"instanceType,omitempty"`

	// subnetPool names the server-side subnet pool instances are placed in.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	SubnetPool string `json:"subnetPool,omitempty"`

	// vars are template variables passed to the server.
	// +optional
	Vars map[string]string `json:"vars,omitempty"`

	// drainTimeout bounds how long a node of this pool is drained before its
	// instance is removed anyway. Unset means the server's default; 0s
	// disables the drain (the instance is deleted at once).
	// +optional
	DrainTimeout *metav1.Duration `json:"drainTimeout,omitempty"`

	// joinTimeout overrides the operator's --join-timeout for the instances
	// of this pool's group: how long after its agent's first health report
	// an instance's Node has to be Ready before the instance is replaced.
	// "0s" turns the join deadline off for this pool; unset means the
	// operator's setting. With --join-timeout=0 there is no join deadline at
	// all, whatever this says.
	// +optional
	JoinTimeout *metav1.Duration `json:"joinTimeout,omitempty"`

	// onDemand opts the pool's group into on-demand pods (pods annotated
	// on-demand.nstance.dev/group with this pool's group, each of which gets
	// a dedicated instance). Unset: such pods are refused.
	// +optional
	OnDemand *OnDemandSpec `json:"onDemand,omitempty"`

	// deletePolicy orders the instances a scale-down removes once those
	// whose Machines carry cluster.x-k8s.io/delete-machine (and Machines
	// being deleted) are taken: Random (Cluster API's MachineSet default:
	// unhealthy first, then the shard with the most replicas, then by
	// instance id, so retries choose the same), Oldest or Newest (unhealthy
	// first, then by creation time over all shards).
	// +optional
	// +kubebuilder:validation:Enum=Random;Oldest;Newest
	// +kubebuilder:default=Random
	DeletePolicy DeletePolicy `json:"deletePolicy,omitempty"`

	// image is the machine image of the pool's instances (for aws an AMI
	// id), the constellation's NodeImage; empty means the server template's.
	// A change rolls the pool under spec.strategy.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[!-~]*$`
	Image string `json:"image,omitempty"`

	// strategy says how the pool replaces members whose infra settings
	// (image, template, instanceType, subnetPool, bootstrap data) changed.
	// Unset: a rolling update with maxSurge 1 and maxUnavailable 0 over all
	// shards.
	// +optional
	Strategy *MachinePoolStrategy `json:"strategy,omitempty"`

	// providerIDList holds the provider IDs of the pool's instances, as the
	// Cluster API MachinePool contract requires.
	// +optional
	// +listType=atomic
	ProviderIDList []string `json:"providerIDList,omitempty"`
}

// DeletePolicy orders a pool's scale-down victims after the ones Cluster
// API marked.
type DeletePolicy string

// Delete policies, named as Cluster API's MachineSet deletion orders.
const (
	DeletePolicyRandom DeletePolicy = "Random"
	DeletePolicyOldest DeletePolicy = "Oldest"
	DeletePolicyNewest DeletePolicy = "Newest"
)

// DefaultOnDemandMaxInstances is spec.onDemand.maxInstances when unset.
const DefaultOnDemandMaxInstances = 10

// OnDemandSpec says whether, and within which limits, pods may ask for
// on-demand instances of a pool's group. The namespaces such pods may live in
// are the operator's setting (on_demand_namespaces), not the pool's.
type OnDemandSpec struct {
	// enabled accepts on-demand pods for this pool's group. False (the
	// default) refuses them.
	// +optional
	Enabled bool `json:"enabled,omitempty"`

	// allowedInstanceTypes are the instance types a pod may ask for with
	// on-demand.nstance.dev/instance-type. The pool's own spec.instanceType
	// is always allowed; empty means no other type (a pod without the
	// annotation gets the group's type).
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=128
	AllowedInstanceTypes []string `json:"allowedInstanceTypes,omitempty"`

	// maxInstances bounds the on-demand instances of this pool's group, over
	// all its shards, counted as the operator's on-demand NstanceMachines of
	// the group (pool replicas do not count). A pod beyond it is refused
	// until one of them goes. Unset: 10; 0 refuses every pod.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	// +kubebuilder:default=10
	MaxInstances *int32 `json:"maxInstances,omitempty"`
}

// NstanceMachinePoolStatus is the observed state of an NstanceMachinePool.
type NstanceMachinePoolStatus struct {
	// initialization follows the Cluster API v1beta2 contract:
	// provisioned turns true once every shard has accepted its group, and
	// stays true. Whether the pool has converged to its size is the Ready
	// condition.
	// +optional
	Initialization InitializationStatus `json:"initialization,omitempty,omitzero"`

	// ready mirrors initialization.provisioned for core Cluster API's
	// MachinePool controller, which reads it as "infrastructure
	// provisioned": it latches once true, so a scale or a shard outage does
	// not freeze the MachinePool's replicas and provider IDs.
	// +optional
	Ready bool `json:"ready,omitempty"`

	// replicas is the number of instances over all shards. It is always
	// written, zero included: core Cluster API copies it to the MachinePool
	// and keeps the previous count when the field is missing.
	// +optional
	Replicas int32 `json:"replicas"`

	// infrastructureMachineKind opts the pool into Cluster API's MachinePool
	// Machines: the operator keeps one NstanceMachine per instance, labelled
	// with the MachinePool's name and cluster, and core CAPI creates a
	// Machine for each. Always NstanceMachine once the pool is reconciled.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	InfrastructureMachineKind string `json:"infrastructureMachineKind,omitempty"`

	// readyReplicas is the number of those instances that are ready.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`

	// upToDateReplicas is the number of instances, over all shards, created
	// with the infra settings the pool asks for now (a shard whose server
	// has not confirmed the current settings counts none).
	// +optional
	UpToDateReplicas int32 `json:"upToDateReplicas"`

	// capacity is what one instance of the pool offers (cpu, memory, pods,
	// ephemeral-storage, nvidia.com/gpu), from the shard server's
	// instance-type catalog; the cluster autoscaler reads it to scale the
	// pool up from zero.
	// +optional
	Capacity corev1.ResourceList `json:"capacity,omitempty"`

	// nodeInfo is the architecture and operating system of the pool's
	// nodes, for the same purpose.
	// +optional
	NodeInfo NodeInfo `json:"nodeInfo,omitempty,omitzero"`

	// observedGeneration is the metadata.generation last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions describe the pool's state.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NstanceMachinePool is the Cluster API infrastructure machine pool for one
// Nstance group spread over several shards.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=nstancemachinepools,scope=Namespaced,categories=cluster-api,shortName=nmp
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1beta1"
// +kubebuilder:printcolumn:name="Group",type="string",JSONPath=".spec.group"
// +kubebuilder:printcolumn:name="Shards",type="string",JSONPath=".spec.shards"
// +kubebuilder:printcolumn:name="Replicas",type="integer",JSONPath=".status.replicas"
// +kubebuilder:printcolumn:name="Ready",type="integer",JSONPath=".status.readyReplicas"
// +kubebuilder:printcolumn:name="Up-To-Date",type="integer",JSONPath=".status.upToDateReplicas"
// +kubebuilder:printcolumn:name="Rolling-Out",type="string",JSONPath=".status.conditions[?(@.type==\"RollingOut\")].status",priority=1
// +kubebuilder:printcolumn:name="Template",type="string",JSONPath=".spec.template",priority=1
// +kubebuilder:printcolumn:name="Image",type="string",JSONPath=".spec.image",priority=1
// +kubebuilder:printcolumn:name="Instance-Type",type="string",JSONPath=".spec.instanceType",priority=1
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type NstanceMachinePool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec NstanceMachinePoolSpec `json:"spec"`
	// +optional
	Status NstanceMachinePoolStatus `json:"status,omitempty"`
}

// GetConditions returns the status conditions.
func (p *NstanceMachinePool) GetConditions() []metav1.Condition { return p.Status.Conditions }

// SetConditions replaces the status conditions.
func (p *NstanceMachinePool) SetConditions(conds []metav1.Condition) { p.Status.Conditions = conds }

// NstanceMachinePoolList is a list of NstanceMachinePool.
// +kubebuilder:object:root=true
type NstanceMachinePoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NstanceMachinePool `json:"items"`
}

func init() {
	SchemeBuilder.Register(&NstanceMachinePool{}, &NstanceMachinePoolList{})
}
