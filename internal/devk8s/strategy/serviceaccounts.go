package strategy

import "github.com/nstance-dev/nstance/internal/devk8s/registry"

// ServiceAccounts are core v1 ServiceAccounts (the token subresource is
// served by the apiserver).
type ServiceAccounts struct{ Generic }

// Resource is the registry entry.
func (ServiceAccounts) Resource() registry.Resource {
	return registry.Resource{Version: "v1", Resource: "serviceaccounts", Kind: "ServiceAccount", Namespaced: true, ShortNames: []string{"sa"}, Subresources: []string{"token"}, BuiltIn: true, ReturnDeleted: true, Storage: true}
}
