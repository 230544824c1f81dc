package crschema

import (
	"sync"

	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/kube-openapi/pkg/validation/spec"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
	"k8s.io/kube-openapi/pkg/validation/validate"
)

// schemaValidator is apiextensions' OpenAPI schema validator of one CRD
// version with kube-openapi's validators built once per schema node
// instead of once per request.
//
// apiextensions (RatchetingSchemaValidator.Validate) calls
// validate.NewSchemaValidator on every request, and kube-openapi's object
// validator then builds a new SchemaValidator for every property it meets:
// about half of a create's validation time goes into building validators
// that are the same every time. A kube-openapi validator is a pure
// function of its schema, root, path and formats (Validate reads its
// fields and returns a fresh Result), so the validators of properties,
// whose paths do not depend on the object, are built once here and handed
// to kube-openapi through its NewValidatorForField hook. Values under
// additionalProperties and array items, whose paths name the object's keys
// and indices, get fresh validators as before. Results are the same as the
// library's.
type schemaValidator struct {
	lib  apiservervalidation.SchemaValidator
	root *validatorNode
	fast *fastNode
}

// newSchemaValidator wraps lib, built by apiextensions from openAPI (its
// second result), as apiextensions builds it: root schema itself, root
// path "", the default formats.
func newSchemaValidator(lib apiservervalidation.SchemaValidator, openAPI *spec.Schema) apiservervalidation.SchemaValidator {
	if lib == nil || openAPI == nil {
		return lib
	}
	return &schemaValidator{lib: lib, root: &validatorNode{schema: openAPI, root: openAPI, path: ""}, fast: newFastNode(openAPI)}
}

// validate is kube-openapi's validation of value: the fast path's answer
// for a valid value it handles, kube-openapi's Result otherwise.
func (v *schemaValidator) validate(value any) *validate.Result {
	if count, ok := v.fast.check(value); ok {
		return &validate.Result{MatchCount: count}
	}
	return v.root.validator().Validate(value)
}

// Validate validates a new object (options are ignored, as apiextensions'
// validators ignore them for Validate).
func (v *schemaValidator) Validate(value any, _ ...apiservervalidation.ValidationOption) *validate.Result {
	return v.validate(value)
}

// ValidateUpdate validates an update. Ratcheting only turns errors of
// unchanged fields into warnings, which no caller reads: a new object that
// validates without errors validates without errors with ratcheting too,
// so only an invalid one goes through apiextensions' ratcheting validator.
func (v *schemaValidator) ValidateUpdate(value, old any, options ...apiservervalidation.ValidationOption) *validate.Result {
	res := v.validate(value)
	if res.IsValid() || !apiservervalidation.NewValidationOptions(options...).Ratcheting {
		return res
	}
	return v.lib.ValidateUpdate(value, old, options...)
}

// validatorNode is the validator of one schema node at one path, built on
// first use, with the nodes of its properties.
type validatorNode struct {
	schema *spec.Schema
	root   any
	path   string

	once  sync.Once
	sv    *validate.SchemaValidator
	props map[string]*validatorNode
}

func (n *validatorNode) validator() *validate.SchemaValidator {
	n.once.Do(n.build)
	return n.sv
}

func (n *validatorNode) build() {
	// kube-openapi asks for pattern properties' validators with the same
	// field names and paths as properties'; CRD schemas have none, but a
	// schema that has them keeps the library's own constructor.
	if len(n.schema.Properties) == 0 || len(n.schema.PatternProperties) > 0 {
		n.sv = validate.NewSchemaValidator(n.schema, n.root, n.path, strfmt.Default)
		return
	}
	n.props = make(map[string]*validatorNode, len(n.schema.Properties))
	for name, prop := range n.schema.Properties {
		path := name
		if n.path != "" {
			path = n.path + "." + name
		}
		n.props[name] = &validatorNode{schema: &prop, root: n.root, path: path}
	}
	n.sv = validate.NewSchemaValidator(n.schema, n.root, n.path, strfmt.Default, func(o *validate.SchemaValidatorOptions) {
		o.NewValidatorForField = n.forField
	})
}

// forField is kube-openapi's NewValidatorForField for this node: the built
// validator of a property, a new one for anything else (kube-openapi's
// default).
func (n *validatorNode) forField(field string, schema *spec.Schema, root any, path string, formats strfmt.Registry, opts ...validate.Option) validate.ValueValidator {
	if c := n.props[field]; c != nil && c.path == path {
		return c.validator()
	}
	return validate.NewSchemaValidator(schema, root, path, formats, opts...)
}
