package strategy

import "github.com/nstance-dev/nstance/internal/devk8s/registry"

// CSINodes are storage.k8s.io/v1 CSINodes.
type CSINodes struct{ Generic }

// Resource is the registry entry.
func (CSINodes) Resource() registry.Resource {
	return registry.Resource{Group: "storage.k8s.io", Version: "v1", Resource: "csinodes", Kind: "CSINode", BuiltIn: true, Storage: true}
}
