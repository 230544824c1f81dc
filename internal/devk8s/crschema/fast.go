package crschema

import (
	"k8s.io/kube-openapi/pkg/validation/spec"
	"k8s.io/kube-openapi/pkg/validation/strfmt"
	"k8s.io/kube-openapi/pkg/validation/validate"
)

// fastNode answers, for one schema node, the question kube-openapi's
// SchemaValidator answers with a Result: is a value valid, and with which
// MatchCount. It answers only when the value is valid and the node uses
// the plain subset of JSON schema CRDs use (types, formats, string, number,
// array and object constraints, string enums); otherwise it declines and
// the caller asks kube-openapi, which stays the reference and produces
// every error. A valid value's Result from kube-openapi holds no errors, no
// warnings and a MatchCount only, so the answer is the whole Result.
//
// kube-openapi allocates for every value (validators' Results, a copy of
// every property's schema per object, debug-log arguments); this walk
// allocates nothing for the values project objects carry. MatchCount
// follows SchemaValidator.Validate: each validator that applies adds its
// own count plus one, and the node adds one.
type fastNode struct {
	// plain is false for nodes the fast path does not handle (composition,
	// pattern properties, dependencies, unique items, tuples, closed
	// objects, non-string enums): values reaching them are declined.
	plain bool

	types       spec.StringOrArray
	nullable    bool
	format      string
	typeApplies bool // kube-openapi's typeValidator.Applies
	knownFormat bool // formatValidator.Applies for strings

	enum []string

	maxLength, minLength *int64
	pattern              string

	numType, numFormat              string // numberValidator's Type and Format
	maximum, minimum, multipleOf    *float64
	exclusiveMaximum, exclusiveMini bool

	items              *fastNode
	maxItems, minItems *int64

	props                        map[string]*fastNode
	additional                   *fastNode
	required                     []string
	maxProperties, minProperties *int64
}

// newFastNode builds the fast validator of a schema and everything under it.
func newFastNode(s *spec.Schema) *fastNode {
	n := &fastNode{
		types:         s.Type,
		nullable:      s.Nullable,
		format:        s.Format,
		typeApplies:   len(s.Type) > 0 || s.Format != "",
		knownFormat:   strfmt.Default.ContainsName(s.Format),
		maxLength:     s.MaxLength,
		minLength:     s.MinLength,
		pattern:       s.Pattern,
		maximum:       s.Maximum,
		minimum:       s.Minimum,
		multipleOf:    s.MultipleOf,
		maxItems:      s.MaxItems,
		minItems:      s.MinItems,
		required:      s.Required,
		maxProperties: s.MaxProperties,
		minProperties: s.MinProperties,

		exclusiveMaximum: s.ExclusiveMaximum,
		exclusiveMini:    s.ExclusiveMinimum,
	}
	if s.Ref.String() != "" || len(s.AllOf) > 0 || len(s.OneOf) > 0 || len(s.AnyOf) > 0 || s.Not != nil ||
		len(s.Dependencies) > 0 || len(s.PatternProperties) > 0 || s.UniqueItems || s.AdditionalItems != nil ||
		(s.Items != nil && len(s.Items.Schemas) > 0) ||
		(s.AdditionalProperties != nil && !s.AdditionalProperties.Allows) {
		return n
	}
	for _, e := range s.Enum {
		str, ok := e.(string)
		if !ok {
			return n
		}
		n.enum = append(n.enum, str)
	}
	if len(s.Enum) > 0 && len(n.enum) == 0 {
		return n
	}
	// numberValidator's Type and Format, as SchemaValidator.numberValidator
	// chooses them.
	if len(s.Type) == 1 {
		switch s.Type[0] {
		case "integer":
			n.numType = "integer"
			if s.Format == "int32" || s.Format == "int64" {
				n.numFormat = s.Format
			}
		case "number":
			n.numType = "number"
			if s.Format == "float" || s.Format == "double" {
				n.numFormat = s.Format
			}
		}
	}
	if s.Items != nil && s.Items.Schema != nil {
		n.items = newFastNode(s.Items.Schema)
	}
	if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
		n.additional = newFastNode(s.AdditionalProperties.Schema)
	}
	if len(s.Properties) > 0 {
		n.props = make(map[string]*fastNode, len(s.Properties))
		for name := range s.Properties {
			p := s.Properties[name]
			n.props[name] = newFastNode(&p)
		}
	}
	n.plain = true
	return n
}

// check returns the MatchCount of kube-openapi's Result for a valid value,
// or false when the value is invalid or not one the fast path handles.
func (n *fastNode) check(value any) (int, bool) {
	if !n.plain {
		return 0, false
	}
	if value == nil {
		// Only the type and enum validators look at a null.
		if len(n.enum) > 0 || (len(n.types) > 0 && !n.types.Contains("null") && !n.nullable) {
			return 0, false
		}
		return 1, true
	}
	// The JSON type and kind kube-openapi's typeValidator infers from the
	// Go type of decoded JSON (a JSON integer decodes to int64).
	var schType, goFormat string
	str, isString := value.(string)
	switch value.(type) {
	case string:
		schType = "string"
	case bool:
		schType = "boolean"
	case int64:
		schType, goFormat = "integer", "int64"
	case float64:
		// A float where an integer is allowed takes typeValidator's
		// float-integer rules: left to kube-openapi.
		if n.types.Contains("integer") {
			return 0, false
		}
		schType, goFormat = "number", "float64"
	case []any:
		schType = "array"
	case map[string]any:
		schType = "object"
	default:
		return 0, false
	}
	count := 0
	if n.typeApplies {
		isIntFloat := schType == "integer" && n.types.Contains("number")
		stringOrSlice := schType == "string" || schType == "array"
		switch {
		case !stringOrSlice && n.format != "" && !(n.types.Contains(schType) || goFormat == n.format || isIntFloat):
			return 0, false
		case !(n.types.Contains("number") || n.types.Contains("integer")) && n.format != "" && stringOrSlice:
		case !(n.types.Contains(schType) || isIntFloat):
			return 0, false
		}
		count += 2
	}
	count += 2 // schemaPropsValidator: nothing to compose
	if isString {
		if n.maxLength != nil && validate.MaxLength("", "", str, *n.maxLength) != nil ||
			n.minLength != nil && validate.MinLength("", "", str, *n.minLength) != nil ||
			n.pattern != "" && validate.Pattern("", "", str, n.pattern) != nil {
			return 0, false
		}
		count++
		if n.knownFormat {
			if validate.FormatOf("", "", n.format, str, strfmt.Default) != nil {
				return 0, false
			}
			count++
		}
	}
	if schType == "integer" || schType == "number" {
		if !n.numberValid(value) {
			return 0, false
		}
		count += 2
	}
	if arr, ok := value.([]any); ok {
		c, ok := n.arrayCount(arr)
		if !ok {
			return 0, false
		}
		count += c + 2
	}
	if len(n.enum) > 0 {
		if !isString || !n.inEnum(str) {
			return 0, false
		}
	}
	count++ // basicCommonValidator
	if obj, ok := value.(map[string]any); ok {
		c, ok := n.objectCount(obj)
		if !ok {
			return 0, false
		}
		count += c + 1
	}
	return count + 1, true
}

func (n *fastNode) inEnum(s string) bool {
	for _, e := range n.enum {
		if e == s {
			return true
		}
	}
	return false
}

// numberValid is numberValidator.Validate without errors; a bound that is
// itself out of the type's range takes kube-openapi's other comparison,
// left to it.
func (n *fastNode) numberValid(value any) bool {
	if validate.IsValueValidAgainstRange(value, n.numType, n.numFormat, "", "") != nil {
		return false
	}
	if n.multipleOf != nil && (validate.IsValueValidAgainstRange(*n.multipleOf, n.numType, n.numFormat, "", "") != nil ||
		validate.MultipleOfNativeType("", "", value, *n.multipleOf) != nil) {
		return false
	}
	if n.maximum != nil && (validate.IsValueValidAgainstRange(*n.maximum, n.numType, n.numFormat, "", "") != nil ||
		validate.MaximumNativeType("", "", value, *n.maximum, n.exclusiveMaximum) != nil) {
		return false
	}
	if n.minimum != nil && (validate.IsValueValidAgainstRange(*n.minimum, n.numType, n.numFormat, "", "") != nil ||
		validate.MinimumNativeType("", "", value, *n.minimum, n.exclusiveMini) != nil) {
		return false
	}
	return true
}

// arrayCount is schemaSliceValidator.Validate's count without its own
// increment.
func (n *fastNode) arrayCount(arr []any) (int, bool) {
	count := 0
	if n.items != nil {
		for _, item := range arr {
			c, ok := n.items.check(item)
			if !ok {
				return 0, false
			}
			count += c
		}
	}
	size := int64(len(arr))
	if n.minItems != nil && size < *n.minItems || n.maxItems != nil && size > *n.maxItems {
		return 0, false
	}
	return count, true
}

// objectCount is objectValidator.Validate's count: the counts of its
// properties and additional properties.
func (n *fastNode) objectCount(obj map[string]any) (int, bool) {
	size := int64(len(obj))
	if n.minProperties != nil && size < *n.minProperties || n.maxProperties != nil && size > *n.maxProperties {
		return 0, false
	}
	count := 0
	for key, value := range obj {
		child := n.props[key]
		if child == nil {
			child = n.additional
		}
		if child == nil {
			continue
		}
		c, ok := child.check(value)
		if !ok {
			return 0, false
		}
		count += c
	}
	for _, name := range n.required {
		if _, ok := obj[name]; !ok {
			return 0, false
		}
	}
	return count, true
}
