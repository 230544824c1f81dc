package strategy

import (
	"strings"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/nstance-dev/nstance/internal/devk8s/object"
	"github.com/nstance-dev/nstance/internal/devk8s/registry"
)

// CRDFinalizer is the finalizer that keeps a CRD until its custom
// resources are gone.
const CRDFinalizer = "customresourcecleanup.apiextensions.k8s.io"

// CustomResourceDefinitions are apiextensions.k8s.io/v1 CRDs. Serving the
// kinds they define, and their cleanup finalizer, is the apiserver's part.
type CustomResourceDefinitions struct{ Generic }

// Resource is the registry entry.
func (CustomResourceDefinitions) Resource() registry.Resource {
	return registry.Resource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions", Kind: "CustomResourceDefinition", ShortNames: []string{"crd", "crds"}, Categories: []string{"api-extensions"}, Status: true, Generation: true, BuiltIn: true, ReturnDeleted: true, Storage: true}
}

// PrepareForCreate fills the spec defaults and the status.
func (CustomResourceDefinitions) PrepareForCreate(_ *registry.Resource, obj map[string]any) {
	defaultCRD(obj)
}

// NormalizeFile gives a new hand-made CRD file without a status the same.
func (CustomResourceDefinitions) NormalizeFile(_ *registry.Resource, old, obj map[string]any) {
	if _, ok := obj["status"]; old == nil && !ok {
		defaultCRD(obj)
	}
}

// Validate checks the name and the single storage version.
func (CustomResourceDefinitions) Validate(_ *registry.Resource, _, obj map[string]any) error {
	var crd apiextensionsv1.CustomResourceDefinition
	if err := object.ToTyped(obj, &crd); err != nil {
		return apierrors.NewBadRequest(err.Error())
	}
	gk := schema.GroupKind{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"}
	var errs field.ErrorList
	if want := crd.Spec.Names.Plural + "." + crd.Spec.Group; crd.Name != want {
		errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), crd.Name, "must be spec.names.plural+\".\"+spec.group"))
	}
	storage := 0
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			storage++
		}
	}
	if storage != 1 {
		errs = append(errs, field.Invalid(field.NewPath("spec", "versions"), len(crd.Spec.Versions), "must have exactly one version marked as storage version"))
	}
	if len(errs) > 0 {
		return apierrors.NewInvalid(gk, crd.Name, errs)
	}
	return nil
}

// Columns are kubectl's CRD columns.
func (CustomResourceDefinitions) Columns() []Column {
	return withNameAge(Column{Def: metav1.TableColumnDefinition{Name: "Created At", Type: "date"},
		Cell: func(o map[string]any) any { return object.NestedString(o, "metadata", "creationTimestamp") }})
}

// defaultCRD fills the spec defaults and the status kube-apiserver's CRD
// controllers would set (names accepted, established), and the cleanup
// finalizer.
func defaultCRD(obj map[string]any) {
	spec, _ := obj["spec"].(map[string]any)
	if spec == nil {
		return
	}
	names, _ := spec["names"].(map[string]any)
	if names == nil {
		return
	}
	if object.Str(names, "singular") == "" {
		names["singular"] = strings.ToLower(object.Str(names, "kind"))
	}
	if object.Str(names, "listKind") == "" && object.Str(names, "kind") != "" {
		names["listKind"] = object.Str(names, "kind") + "List"
	}
	if _, ok := spec["conversion"]; !ok {
		spec["conversion"] = map[string]any{"strategy": "None"}
	}
	var stored []any
	for _, v := range object.List(spec["versions"]) {
		m, _ := v.(map[string]any)
		if m != nil && m["storage"] == true {
			stored = append(stored, object.Str(m, "name"))
		}
	}
	now := object.Timestamp(time.Now())
	obj["status"] = map[string]any{
		"acceptedNames": object.DeepCopy(names),
		"conditions": []any{
			map[string]any{"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
			map[string]any{"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
		},
		"storedVersions": stored,
	}
	md := object.Meta(obj)
	fs := finalizers(md)
	for _, f := range fs {
		if f == CRDFinalizer {
			return
		}
	}
	raw := make([]any, 0, len(fs)+1)
	for _, f := range fs {
		raw = append(raw, f)
	}
	md["finalizers"] = append(raw, CRDFinalizer)
}
