package strategy

import "github.com/nstance-dev/nstance/internal/devk8s/registry"

// RuntimeClasses are node.k8s.io/v1 RuntimeClasses.
type RuntimeClasses struct{ Generic }

// Resource is the registry entry.
func (RuntimeClasses) Resource() registry.Resource {
	return registry.Resource{Group: "node.k8s.io", Version: "v1", Resource: "runtimeclasses", Kind: "RuntimeClass", BuiltIn: true, Storage: true}
}
