package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

// Condition types on an NstanceControlPlane, besides Cluster API's Paused.
const (
	// AvailableCondition is true while the workload kubeconfig Secret
	// exists. Core Cluster API mirrors it into the Cluster's
	// ControlPlaneAvailable condition.
	AvailableCondition = "Available"
	// ReadyCondition is true when the control plane is fully reconciled: the
	// kubeconfig Secret exists and, when the operator manages it, its token
	// is fresh.
	ReadyCondition = "Ready"
)

// Condition reasons.
const (
	// KubeconfigAvailableReason: the <cluster>-kubeconfig Secret exists.
	KubeconfigAvailableReason = "KubeconfigAvailable"
	// WaitingForKubeconfigReason: the <cluster>-kubeconfig Secret does not
	// exist (yet), or holds no kubeconfig.
	WaitingForKubeconfigReason = "WaitingForKubeconfig"
	// KubeconfigRefreshFailedReason: writing the kubeconfig Secret or
	// requesting its token failed; the last Secret, if any, stays.
	KubeconfigRefreshFailedReason = "KubeconfigRefreshFailed"
	// NotReferencedReason: the Cluster names another control plane, so this
	// object manages nothing.
	NotReferencedReason = "NotReferencedByCluster"
	// DeletingReason: the object is being deleted.
	DeletingReason = "Deleting"
)

// ControlPlaneFinalizer keeps an NstanceControlPlane until the kubeconfig
// Secret it manages is removed.
const ControlPlaneFinalizer = "nstancecontrolplane.controlplane.cluster.x-k8s.io"

// NstanceControlPlaneSpec is the desired state of an NstanceControlPlane.
type NstanceControlPlaneSpec struct {
	// controlPlaneEndpoint is where the workload cluster's API server is
	// reached. Core Cluster API copies it to a Cluster that has none once
	// the control plane is initialized.
	// +optional
	ControlPlaneEndpoint infrav1.APIEndpoint `json:"controlPlaneEndpoint,omitempty,omitzero"`
}

// NstanceControlPlaneInitializationStatus is the v1beta2 control plane
// contract's status.initialization block.
// +kubebuilder:validation:MinProperties=1
type NstanceControlPlaneInitializationStatus struct {
	// controlPlaneInitialized is true once the workload cluster's kubeconfig
	// Secret exists, so Cluster API can reach its API server. It never goes
	// back to false.
	// +optional
	ControlPlaneInitialized *bool `json:"controlPlaneInitialized,omitempty"`
}

// NstanceControlPlaneStatus is the observed state of an NstanceControlPlane.
type NstanceControlPlaneStatus struct {
	// initialization follows the Cluster API v1beta2 control plane contract.
	// +optional
	Initialization NstanceControlPlaneInitializationStatus `json:"initialization,omitempty,omitzero"`

	// externalManagedControlPlane is always true: the control plane runs
	// outside Cluster API Machines, so core Cluster API deletes the Nodes of
	// worker Machines without waiting for control plane Machines.
	// +optional
	ExternalManagedControlPlane *bool `json:"externalManagedControlPlane,omitempty"`

	// observedGeneration is the metadata.generation last reconciled.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// conditions describe the control plane's state: Available, Ready and
	// Paused.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=32
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NstanceControlPlane is the Cluster API control plane of a cluster whose
// API server runs outside Nstance instances (the cluster the operator runs
// in, or one reached through NSTANCE_CAPI_ENDPOINT). It owns the
// <cluster>-kubeconfig Secret core Cluster API connects with.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:path=nstancecontrolplanes,scope=Namespaced,categories=cluster-api,shortName=ncp
// +kubebuilder:metadata:labels="cluster.x-k8s.io/v1beta2=v1beta1"
// +kubebuilder:printcolumn:name="Cluster",type="string",JSONPath=".metadata.labels['cluster\\.x-k8s\\.io/cluster-name']"
// +kubebuilder:printcolumn:name="Initialized",type="boolean",JSONPath=".status.initialization.controlPlaneInitialized"
// +kubebuilder:printcolumn:name="Endpoint",type="string",JSONPath=".spec.controlPlaneEndpoint.host"
// +kubebuilder:printcolumn:name="Age",type="date",JSONPath=".metadata.creationTimestamp"
type NstanceControlPlane struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// +optional
	Spec NstanceControlPlaneSpec `json:"spec,omitempty"`
	// +optional
	Status NstanceControlPlaneStatus `json:"status,omitempty"`
}

// GetConditions returns the status conditions.
func (c *NstanceControlPlane) GetConditions() []metav1.Condition { return c.Status.Conditions }

// SetConditions replaces the status conditions.
func (c *NstanceControlPlane) SetConditions(conds []metav1.Condition) { c.Status.Conditions = conds }

// NstanceControlPlaneList is a list of NstanceControlPlane.
// +kubebuilder:object:root=true
type NstanceControlPlaneList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NstanceControlPlane `json:"items"`
}

func init() {
	SchemeBuilder.Register(&NstanceControlPlane{}, &NstanceControlPlaneList{})
}
