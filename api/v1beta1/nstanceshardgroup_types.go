package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NstanceShardGroupSpec is the part of a pool's group that one shard runs.
type NstanceShardGroupSpec struct {
	// group is the Nstance group name. It cannot change.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]+(-[a-z0-9]+)*$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="group is immutable"
	Group string `json:"group"`

	// shard is the shard ID whose server runs this part. It cannot change.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="shard is immutable"
	Shard string `json:"shard"`

	// size is the number of instances wanted in this shard.
	// +required
	// +kubebuilder:validation:Minimum=0
	Size int32 `json:"size"`

	// template names the server-side instance template.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Template string `json:"template,omitempty"`

	// instanceType is the provider instance type.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	InstanceType string `json:"instanceType,omitempty"`

	// subnetPool names the server-side subnet pool.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	SubnetPool string `json:"subnetPool,omitempty"`

	// vars are template variables passed to the server.
	// +optional
	Vars map[string]string `json:"vars,omitempty"`

	// drainTimeout bounds how long a node is drained before removal. Unset
	// means the server's default; 0s disables the drain (the instance is
	// deleted at once).
	// +optional
	DrainTimeout *metav1.Duration `json:"drainTimeout,omitempty"`

	// image is the instances' machine image (GroupSpec.image); empty means
	// the server template's.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[!-~]*$`
	Image string `json:"image,omitempty"`

	// rollout is this shard's part of the pool's rollout budget (the
	// server's GroupSpec.rollout). Unset: the server's defaults.
	// +optional
	Rollout *ShardRollout `json:"rollout,omitempty"`

	// bootstrapDataSecretName names the Secret, in this object's namespace,
	// holding the instances' Cluster API bootstrap data (key "value", and
	// optionally "format": "cloud-config" or "ignition"). The owning pool
	// copies it from its MachinePool's spec.template.spec.bootstrap.dataSecretName.
	// Empty means none: the instance template's userdata applies. A new name
	// whose data differs rolls the group's instances onto it.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	BootstrapDataSecretName string `json:"bootstrapDataSecretName,omitempty"`
}

// NstanceShardGroupStatus is what the shard's server reports for the group.
type NstanceShardGroupStatus struct {
	// replicas is the number of instances the server has for the group.
	// +optional
	Replicas int32 `json:"replicas,omitempty"`

	// readyReplicas is the number of those instances that are ready.
	// +optional
	ReadyReplicas int32 `json:"readyReplicas,omitempty"`

	// upToDateReplicas is the number of those instances created with the
	// group's current infra settings (the server's up_to_date_count).
	// +optional
	UpToDateReplicas int32 `json:"upToDateReplicas,omitempty"`

	// observedInfra is a digest of the infra settings (template,
	// instanceType, subnetPool, image, bootstrapDataSecretName) the server
	// confirmed with the last status: upToDateReplicas counts against them.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	ObservedInfra string `json:"observedInfra,omitempty"`

	// providerIDs of the group's instances in this shard, sorted.
	// +optional
	// +listType=atomic
	ProviderIDs []string `json:"providerIDs,omitempty"`

	// lastSyncTime is when the server last confirmed the desired state.
	// +optional
	LastSyncTime *metav1.Time `json:"lastSyncTime,omitempty"`

	// observedGeneration is the metadata.generation last synced.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions: Ready, ShardReachable and ConfigValid.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NstanceShardGroup is one shard's part of an NstanceMachinePool, named
// ShardGroupName(group, shard) and owned by the pool.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=nstanceshardgroups,scope=Namespaced,categories=cluster-api,shortName=nsg
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1beta1"
// +kubebuilder:printcolumn:name="Group",type="string",JSONPath=".spec.group"
// +kubebuilder:printcolumn:name="Shard",type="string",JSONPath=".spec.shard"
// +kubebuilder:printcolumn:name="Size",type="integer",JSONPath=".spec.size"
// +kubebuilder:printcolumn:name="Replicas",type="integer",JSONPath=".status.replicas"
// +kubebuilder:printcolumn:name="Ready",type="integer",JSONPath=".status.readyReplicas"
// +kubebuilder:printcolumn:name="Up-To-Date",type="integer",JSONPath=".status.upToDateReplicas"
// +kubebuilder:printcolumn:name="Reachable",type="string",JSONPath=".status.conditions[?(@.type==\"ShardReachable\")].status",priority=1
// +kubebuilder:printcolumn:name="Last-Sync",type="date",JSONPath=".status.lastSyncTime",priority=1
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type NstanceShardGroup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec NstanceShardGroupSpec `json:"spec"`
	// +optional
	Status NstanceShardGroupStatus `json:"status,omitempty"`
}

// GetConditions returns the status conditions.
func (g *NstanceShardGroup) GetConditions() []metav1.Condition { return g.Status.Conditions }

// SetConditions replaces the status conditions.
func (g *NstanceShardGroup) SetConditions(conds []metav1.Condition) { g.Status.Conditions = conds }

// NstanceShardGroupList is a list of NstanceShardGroup.
// +kubebuilder:object:root=true
type NstanceShardGroupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NstanceShardGroup `json:"items"`
}

func init() {
	SchemeBuilder.Register(&NstanceShardGroup{}, &NstanceShardGroupList{})
}
