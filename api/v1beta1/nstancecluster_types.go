package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NstanceClusterSpec is the desired state of an NstanceCluster.
type NstanceClusterSpec struct {
	// controlPlaneEndpoint is where the workload cluster's API server is
	// reached. Cluster API copies it to the Cluster.
	// +optional
	ControlPlaneEndpoint APIEndpoint `json:"controlPlaneEndpoint,omitempty,omitzero"`
}

// NstanceClusterStatus is the observed state of an NstanceCluster.
type NstanceClusterStatus struct {
	// initialization follows the Cluster API v1beta2 contract.
	// +optional
	Initialization InitializationStatus `json:"initialization,omitempty,omitzero"`

	// ready is true when the cluster infrastructure is usable. Kept for
	// readers of the older contract.
	// +optional
	Ready bool `json:"ready,omitempty"`

	// failureDomains lists one entry per shard.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=100
	FailureDomains []FailureDomain `json:"failureDomains,omitempty"`

	// observedGeneration is the metadata.generation last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions describe the cluster's state.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NstanceCluster is the Cluster API infrastructure cluster for Nstance.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=nstanceclusters,scope=Namespaced,categories=cluster-api,shortName=nc
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1beta1"
// +kubebuilder:printcolumn:name="Cluster",type="string",JSONPath=".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"
// +kubebuilder:printcolumn:name="Endpoint",type="string",JSONPath=".spec.controlPlaneEndpoint.host"
// +kubebuilder:printcolumn:name="Ready",type="boolean",JSONPath=".status.ready"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type NstanceCluster struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec NstanceClusterSpec `json:"spec,omitempty"`
	// +optional
	Status NstanceClusterStatus `json:"status,omitempty"`
}

// GetConditions returns the status conditions.
func (c *NstanceCluster) GetConditions() []metav1.Condition { return c.Status.Conditions }

// SetConditions replaces the status conditions.
func (c *NstanceCluster) SetConditions(conds []metav1.Condition) { c.Status.Conditions = conds }

// NstanceClusterList is a list of NstanceCluster.
// +kubebuilder:object:root=true
type NstanceClusterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NstanceCluster `json:"items"`
}

func init() {
	SchemeBuilder.Register(&NstanceCluster{}, &NstanceClusterList{})
}
