package strategy

import (
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/nstance-dev/nstance/internal/devk8s/object"
	"github.com/nstance-dev/nstance/internal/devk8s/registry"
)

// ConfigMaps are core v1 ConfigMaps.
type ConfigMaps struct{ Generic }

// Resource is the registry entry.
func (ConfigMaps) Resource() registry.Resource {
	return registry.Resource{Version: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true, ShortNames: []string{"cm"}, BuiltIn: true, Storage: true}
}

// Validate keeps the data of an immutable ConfigMap.
func (ConfigMaps) Validate(res *registry.Resource, old, obj map[string]any) error {
	return validateImmutableData(res, old, obj)
}

// Columns are kubectl's ConfigMap columns.
func (ConfigMaps) Columns() []Column { return withNameAge(dataCol()) }

// validateImmutableData refuses data changes once immutable is set
// (ConfigMaps and Secrets).
func validateImmutableData(res *registry.Resource, old, obj map[string]any) error {
	if old == nil || old["immutable"] != true {
		return nil
	}
	for _, k := range []string{"data", "binaryData"} {
		if !object.Equal(old[k], obj[k]) {
			return apierrors.NewInvalid(res.GVK().GroupKind(), object.Str(object.Meta(obj), "name"),
				field.ErrorList{field.Forbidden(field.NewPath("data"), "field is immutable when `immutable` is set")})
		}
	}
	return nil
}

// dataCol counts data and binaryData keys.
func dataCol() Column {
	return Column{Def: metav1.TableColumnDefinition{Name: "Data", Type: "string"}, Cell: func(o map[string]any) any {
		d, _ := o["data"].(map[string]any)
		b, _ := o["binaryData"].(map[string]any)
		return int64(len(d) + len(b))
	}}
}
