package crschema

import (
	"context"

	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	structurallisttype "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apiextensions-apiserver/pkg/crdserverscheme"
	"k8s.io/apiextensions-apiserver/pkg/registry/customresource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
)

// createValidation is the customresource strategy's Validate (what a
// create is validated with) for a version whose schema has no
// x-kubernetes-embedded-resource node, put together from the same
// library parts in the same order, minus the embedded-resource walk.
//
// The strategy walks every object along the structural schema
// (objectmeta.Validate) to validate embedded resources' apiVersion, kind
// and metadata; that walk reports errors only at embedded-resource nodes,
// so without any it returns nothing, while allocating a copy of the
// schema node for every field it visits. The rest is the library's:
// TestCreateValidationMatchesStrategy compares it with the strategy on
// random objects.
type createValidation struct {
	// meta is a customresource strategy without a structural schema: its
	// Validate is the strategy's type, object metadata, OpenAPI schema and
	// scale validation alone (the walk, list types and CEL rules need the
	// structural schema and do nothing without one).
	meta       strategy
	structural *structuralschema.Structural
	// hasCEL is whether the strategy has a CEL validator (it then adds
	// an error when other errors keep the rules from running); cel runs
	// the rules a create runs (nil: none).
	hasCEL bool
	cel    *cel.Validator
}

// newCreateValidation returns the create validation of a version, nil
// when the version needs the strategy's own (no structural schema, or
// embedded resources).
func newCreateValidation(gvk schema.GroupVersionKind, namespaced bool, validator apiservervalidation.SchemaValidator, s *structuralschema.Structural, scale *apiextensionsinternal.CustomResourceSubresourceScale, embedded bool) *createValidation {
	if s == nil || embedded {
		return nil
	}
	meta := customresource.NewStrategy(crdserverscheme.NewUnstructuredObjectTyper(), namespaced, gvk, validator, nil, nil, nil, scale, nil)
	// The strategy has a CEL validator exactly when a node has rules
	// (cel.NewValidator returns nil otherwise); the rules a create runs are
	// compiled again without the others.
	return &createValidation{meta: meta, structural: s,
		hasCEL: anyNode(s, func(n *structuralschema.Structural) bool { return len(n.XValidations) > 0 }),
		cel:    cel.NewValidator(withoutTransitionRules(s), true, celconfig.PerCallLimit)}
}

// validate is customResourceStrategy.Validate without the embedded walk.
func (c *createValidation) validate(ctx context.Context, u *unstructured.Unstructured) field.ErrorList {
	errs := c.meta.Validate(ctx, u)
	errs = append(errs, structurallisttype.ValidateListSetsAndMaps(nil, c.structural, u.Object)...)
	if c.hasCEL {
		if blocking := blockingError(errs); blocking != nil {
			errs = append(errs, blocking)
		} else if c.cel != nil {
			celErrs, _ := c.cel.Validate(ctx, nil, c.structural, u.Object, nil, celconfig.RuntimeCELCostBudget)
			errs = append(errs, celErrs...)
		}
	}
	return errs
}

// blockingError is the strategy's hasBlockingErr: CEL rules are not run
// on an object with errors of these types.
func blockingError(errs field.ErrorList) *field.Error {
	for _, err := range errs {
		switch err.Type {
		case field.ErrorTypeNotSupported, field.ErrorTypeRequired, field.ErrorTypeTooLong, field.ErrorTypeTooMany, field.ErrorTypeTypeInvalid:
			return field.Invalid(nil, nil, "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation")
		}
	}
	return nil
}
