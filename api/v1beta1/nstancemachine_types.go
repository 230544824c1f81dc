package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NstanceMachineSpec is the desired state of a single Nstance instance.
//
// instanceID and shard name the instance once it exists. They live in spec,
// not only in status, because clusterctl move recreates objects without
// their status: the operator then finds the instance again instead of
// creating a second one. Once set they never change.
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.instanceID) || (has(self.instanceID) && self.instanceID == oldSelf.instanceID)",message="instanceID is immutable once set"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.shard) || (has(self.shard) && self.shard == oldSelf.shard)",message="shard is immutable once set"
type NstanceMachineSpec struct {
	// providerID identifies the instance. Per the Cluster API contract it is
	// equal to the spec.providerID of the Node the instance registers as. The
	// operator sets it once the server has created the instance.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=512
	ProviderID string `json:"providerID,omitempty"`

	// group is the Nstance group the instance is created in.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]+(-[a-z0-9]+)*$`
	Group string `json:"group"`

	// instanceType overrides the group's instance type.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	InstanceType string `json:"instanceType,omitempty"`

	// template overrides the group's server-side instance template.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	Template string `json:"template,omitempty"`

	// subnetPool overrides the group's subnet pool.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	SubnetPool string `json:"subnetPool,omitempty"`

	// image is the instance's machine image (for aws an AMI id); empty
	// means the server template's. In an NstanceMachineTemplate a new image
	// means a new template, so the MachineDeployment rolls its Machines.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	// +kubebuilder:validation:Pattern=`^[!-~]*$`
	Image string `json:"image,omitempty"`

	// vars are template variables for this instance.
	// +optional
	Vars map[string]string `json:"vars,omitempty"`

	// shard pins the instance to a shard. Normally empty: the operator then
	// takes the owning Machine's spec.failureDomain (or its default shard)
	// and records it here before it creates the instance.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Shard string `json:"shard,omitempty"`

	// instanceID is the server's ID of the instance. The operator sets it
	// once the server has created the instance (as other providers keep
	// their cloud's instance ID in spec).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	InstanceID string `json:"instanceID,omitempty"`
}

// NstanceMachineStatus is the observed state of an NstanceMachine.
type NstanceMachineStatus struct {
	// initialization follows the Cluster API v1beta2 contract.
	// +optional
	Initialization InitializationStatus `json:"initialization,omitempty,omitzero"`

	// ready is true when the instance is running.
	// +optional
	Ready bool `json:"ready,omitempty"`

	// instanceID mirrors spec.instanceID.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	InstanceID string `json:"instanceID,omitempty"`

	// shard the instance runs in; mirrors spec.shard.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	Shard string `json:"shard,omitempty"`

	// failureDomain reports the shard to Cluster API (v1beta2 contract).
	// +optional
	// +kubebuilder:validation:MaxLength=256
	FailureDomain string `json:"failureDomain,omitempty"`

	// addresses of the instance.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	Addresses []MachineAddress `json:"addresses,omitempty"`

	// state is the instance state the server last reported.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	State string `json:"state,omitempty"`

	// failureReason is a short machine-readable reason for a terminal failure.
	// +optional
	// +kubebuilder:validation:MaxLength=256
	FailureReason *string `json:"failureReason,omitempty"`

	// failureMessage explains a terminal failure to a person.
	// +optional
	// +kubebuilder:validation:MaxLength=10240
	FailureMessage *string `json:"failureMessage,omitempty"`

	// observedGeneration is the metadata.generation last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions describe the machine's state.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NstanceMachine is the Cluster API infrastructure machine for one Nstance
// instance.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=nstancemachines,scope=Namespaced,categories=cluster-api,shortName=nm
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1beta1"
// +kubebuilder:printcolumn:name="Shard",type="string",JSONPath=".spec.shard"
// +kubebuilder:printcolumn:name="ProviderID",type="string",JSONPath=".spec.providerID"
// +kubebuilder:printcolumn:name="Ready",type="boolean",JSONPath=".status.ready"
// +kubebuilder:printcolumn:name="Group",type="string",JSONPath=".spec.group",priority=1
// +kubebuilder:printcolumn:name="Instance",type="string",JSONPath=".spec.instanceID",priority=1
// +kubebuilder:printcolumn:name="State",type="string",JSONPath=".status.state",priority=1
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type NstanceMachine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec NstanceMachineSpec `json:"spec"`
	// +optional
	Status NstanceMachineStatus `json:"status,omitempty"`
}

// GetConditions returns the status conditions.
func (m *NstanceMachine) GetConditions() []metav1.Condition { return m.Status.Conditions }

// SetConditions replaces the status conditions.
func (m *NstanceMachine) SetConditions(conds []metav1.Condition) { m.Status.Conditions = conds }

// NstanceMachineList is a list of NstanceMachine.
// +kubebuilder:object:root=true
type NstanceMachineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NstanceMachine `json:"items"`
}

func init() {
	SchemeBuilder.Register(&NstanceMachine{}, &NstanceMachineList{})
}
