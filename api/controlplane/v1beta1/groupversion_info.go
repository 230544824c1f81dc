// Package v1beta1 holds the Nstance Cluster API control plane provider types
// (group controlplane.cluster.x-k8s.io, version v1beta1): NstanceControlPlane,
// the externally managed control plane of a cluster whose API server Nstance
// does not run itself.
// +kubebuilder:object:generate=true
// +groupName=controlplane.cluster.x-k8s.io
package v1beta1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of the control plane kinds.
	GroupVersion = schema.GroupVersion{Group: "controlplane.cluster.x-k8s.io", Version: "v1beta1"}

	// SchemeBuilder registers the control plane kinds with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion} //nolint:staticcheck // the kubebuilder layout every provider's api package uses (CAPI's too)

	// AddToScheme adds the control plane kinds to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
