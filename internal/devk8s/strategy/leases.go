package strategy

import "github.com/nstance-dev/nstance/internal/devk8s/registry"

// Leases are coordination.k8s.io/v1 Leases.
type Leases struct{ Generic }

// Resource is the registry entry.
func (Leases) Resource() registry.Resource {
	return registry.Resource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases", Kind: "Lease", Namespaced: true, BuiltIn: true, CreateOnUpdate: true, Storage: true}
}

// Columns are kubectl's Lease columns.
func (Leases) Columns() []Column {
	return withNameAge(pathCol("Holder", "string", 0, "spec", "holderIdentity"))
}
