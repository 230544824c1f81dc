package strategy

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nstance-dev/nstance/internal/devk8s/object"
	"github.com/nstance-dev/nstance/internal/devk8s/registry"
)

// LimitRanges are core v1 LimitRanges: stored and served as they come
// (through their Go type), with kubectl's columns. dev-k8s does not
// enforce them.
type LimitRanges struct{ Generic }

// Resource is the registry entry.
func (LimitRanges) Resource() registry.Resource {
	return registry.Resource{Version: "v1", Resource: "limitranges", Kind: "LimitRange", Namespaced: true, ShortNames: []string{"limits"}, BuiltIn: true, Storage: true}
}

// Columns are kube-apiserver's LimitRange columns.
func (LimitRanges) Columns() []Column {
	return []Column{NameColumn(), {Def: metav1.TableColumnDefinition{Name: "Created At", Type: "date"},
		Cell: func(o map[string]any) any { return object.NestedString(o, "metadata", "creationTimestamp") }}}
}
