// Package v1beta1 holds the Nstance Cluster API infrastructure provider types
// (group infrastructure.cluster.x-k8s.io, version v1beta1).
// +kubebuilder:object:generate=true
// +groupName=infrastructure.cluster.x-k8s.io
package v1beta1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of the Nstance kinds.
	GroupVersion = schema.GroupVersion{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta1"}

	// SchemeBuilder registers the Nstance kinds with a runtime.Scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion} //nolint:staticcheck // the kubebuilder layout every provider's api package uses (CAPI's too)

	// AddToScheme adds the Nstance kinds to a runtime.Scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
