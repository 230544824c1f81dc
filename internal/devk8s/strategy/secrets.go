package strategy

import (
	"github.com/nstance-dev/nstance/internal/devk8s/object"
	"github.com/nstance-dev/nstance/internal/devk8s/registry"
)

// Secrets are core v1 Secrets.
type Secrets struct{ Generic }

// Resource is the registry entry.
func (Secrets) Resource() registry.Resource {
	return registry.Resource{Version: "v1", Resource: "secrets", Kind: "Secret", Namespaced: true, BuiltIn: true, Storage: true}
}

// Default sets type Opaque.
func (Secrets) Default(_ *registry.Resource, obj map[string]any) {
	if object.Str(obj, "type") == "" {
		obj["type"] = "Opaque"
	}
}

// Validate keeps the data of an immutable Secret.
func (Secrets) Validate(res *registry.Resource, old, obj map[string]any) error {
	return validateImmutableData(res, old, obj)
}

// Fields are the Secret field selectors.
func (Secrets) Fields() []Field { return pathFields("type") }

// Columns are kubectl's Secret columns.
func (Secrets) Columns() []Column {
	return withNameAge(pathCol("Type", "string", 0, "type"), dataCol())
}
