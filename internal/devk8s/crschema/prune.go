package crschema

import structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"

// pruneNode is the part of a structural schema node pruning reads, built
// once per CRD version so that finding out whether pruning would delete
// anything copies no schema node (apiextensions' pruning copies one for
// every field it visits). A nil *pruneNode is a missing schema, under
// which pruning deletes every field.
type pruneNode struct {
	preserveUnknown bool // x-kubernetes-preserve-unknown-fields
	embedded        bool // x-kubernetes-embedded-resource
	props           map[string]*pruneNode
	hasAdditional   bool // additionalProperties set (additional may still be nil)
	additional      *pruneNode
	items           *pruneNode
}

// newPruneRoot builds the tree of a resource's schema as pruning sees it
// at the resource root: a missing schema is an empty one, and the root is
// an embedded resource (its apiVersion, kind and metadata are kept).
func newPruneRoot(s *structuralschema.Structural) *pruneNode {
	if s == nil {
		s = &structuralschema.Structural{}
	}
	n := newPruneNode(s)
	n.embedded = true
	return n
}

func newPruneNode(s *structuralschema.Structural) *pruneNode {
	if s == nil {
		return nil
	}
	n := &pruneNode{
		preserveUnknown: s.XPreserveUnknownFields,
		embedded:        s.XEmbeddedResource,
		items:           newPruneNode(s.Items),
	}
	if s.AdditionalProperties != nil {
		n.hasAdditional = true
		n.additional = newPruneNode(s.AdditionalProperties.Structural)
	}
	if len(s.Properties) > 0 {
		n.props = make(map[string]*pruneNode, len(s.Properties))
		for name := range s.Properties {
			p := s.Properties[name]
			n.props[name] = newPruneNode(&p)
		}
	}
	return n
}

// prunes reports whether apiextensions' pruning of x with this node
// (pruning's prune; PruneWithOptions at the resource root with the root
// node) would delete anything. Pruning that deletes nothing also records
// no unknown field, so when this is false the pruning can be left out.
func (n *pruneNode) prunes(x any) bool {
	if n != nil && n.preserveUnknown {
		return n.skipPrunes(x)
	}
	switch x := x.(type) {
	case map[string]any:
		if n == nil {
			return len(x) > 0
		}
		return n.fieldsPrune(x, false)
	case []any:
		var items *pruneNode
		if n != nil {
			items = n.items
		}
		for _, v := range x {
			if items.prunes(v) {
				return true
			}
		}
	}
	return false
}

// skipPrunes is pruning's skipPrune: under
// x-kubernetes-preserve-unknown-fields unknown fields stay, known ones are
// pruned by their schemas.
func (n *pruneNode) skipPrunes(x any) bool {
	if n == nil {
		return false
	}
	switch x := x.(type) {
	case map[string]any:
		return n.fieldsPrune(x, true)
	case []any:
		for _, v := range x {
			if n.items.skipPrunes(v) {
				return true
			}
		}
	}
	return false
}

// fieldsPrune reports whether pruning an object's fields deletes anything:
// a known field's value by its schema, an unknown one itself unless
// preserveUnknown.
func (n *pruneNode) fieldsPrune(x map[string]any, preserveUnknown bool) bool {
	for k, v := range x {
		if n.embedded && isMetaField(k) {
			continue
		}
		if p, ok := n.props[k]; ok {
			if p.prunes(v) {
				return true
			}
		} else if n.hasAdditional {
			if n.additional.prunes(v) {
				return true
			}
		} else if !preserveUnknown {
			return true
		}
	}
	return false
}

func isMetaField(k string) bool { return k == "apiVersion" || k == "kind" || k == "metadata" }
