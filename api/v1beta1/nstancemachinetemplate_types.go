package v1beta1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NstanceMachineTemplateResource is what an NstanceMachine is made from.
// +kubebuilder:validation:XValidation:rule="!has(self.spec.instanceID)",message="a template must not name an instance: spec.instanceID is set by the operator"
type NstanceMachineTemplateResource struct {
	// metadata is copied to the NstanceMachines made from the template.
	// +optional
	ObjectMeta ObjectMeta `json:"metadata,omitempty,omitzero"`

	// spec of the NstanceMachines made from the template.
	// +required
	Spec NstanceMachineSpec `json:"spec"`
}

// NstanceMachineTemplateSpec is the desired state of an NstanceMachineTemplate.
type NstanceMachineTemplateSpec struct {
	// template describes the NstanceMachines to create. It cannot change,
	// as the Cluster API contract asks of infrastructure machine templates:
	// Machines already made from it would silently differ from it. To roll
	// out a change, create a new template and point the MachineDeployment
	// (or MachineSet) at it.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="template is immutable: create a new NstanceMachineTemplate and reference it instead"
	Template NstanceMachineTemplateResource `json:"template"`
}

// NstanceMachineTemplateStatus is the observed state of an
// NstanceMachineTemplate.
type NstanceMachineTemplateStatus struct {
	// capacity is what one machine made from the template offers (cpu,
	// memory, pods, ephemeral-storage, nvidia.com/gpu), from the shard
	// server's instance-type catalog; the cluster autoscaler reads it to
	// scale from zero.
	// +optional
	Capacity corev1.ResourceList `json:"capacity,omitempty"`

	// nodeInfo is the architecture and operating system of the machines
	// made from the template, for the same purpose.
	// +optional
	NodeInfo NodeInfo `json:"nodeInfo,omitempty,omitzero"`

	// conditions describe the template's state.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NstanceMachineTemplate is the Cluster API infrastructure machine template
// for Nstance.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=nstancemachinetemplates,scope=Namespaced,categories=cluster-api,shortName=nmt
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1beta1"
// +kubebuilder:printcolumn:name="Group",type="string",JSONPath=".spec.template.spec.group"
// +kubebuilder:printcolumn:name="Instance-Type",type="string",JSONPath=".spec.template.spec.instanceType"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type NstanceMachineTemplate struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +required
	Spec NstanceMachineTemplateSpec `json:"spec"`
	// +optional
	Status NstanceMachineTemplateStatus `json:"status,omitempty"`
}

// GetConditions returns the status conditions.
func (t *NstanceMachineTemplate) GetConditions() []metav1.Condition { return t.Status.Conditions }

// SetConditions replaces the status conditions.
func (t *NstanceMachineTemplate) SetConditions(conds []metav1.Condition) {
	t.Status.Conditions = conds
}

// NstanceMachineTemplateList is a list of NstanceMachineTemplate.
// +kubebuilder:object:root=true
type NstanceMachineTemplateList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NstanceMachineTemplate `json:"items"`
}

func init() {
	SchemeBuilder.Register(&NstanceMachineTemplate{}, &NstanceMachineTemplateList{})
}
