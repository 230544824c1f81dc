package strategy

import "github.com/nstance-dev/nstance/internal/devk8s/registry"

// CSIDrivers are storage.k8s.io/v1 CSIDrivers.
type CSIDrivers struct{ Generic }

// Resource is the registry entry.
func (CSIDrivers) Resource() registry.Resource {
	return registry.Resource{Group: "storage.k8s.io", Version: "v1", Resource: "csidrivers", Kind: "CSIDriver", BuiltIn: true, Storage: true}
}
