package strategy

import "github.com/nstance-dev/nstance/internal/devk8s/registry"

// Services are core v1 Services.
type Services struct{ Generic }

// Resource is the registry entry.
func (Services) Resource() registry.Resource {
	return registry.Resource{Version: "v1", Resource: "services", Kind: "Service", Namespaced: true, ShortNames: []string{"svc"}, Categories: []string{"all"}, Status: true, BuiltIn: true, Storage: true}
}

// Fields are the Service field selectors (the kubelet's Service informer
// lists spec.clusterIP!=None).
func (Services) Fields() []Field { return pathFields("spec.clusterIP", "spec.type") }
