package crschema

import (
	"math"

	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel/model"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	apiservercel "k8s.io/apiserver/pkg/cel"
	"k8s.io/apiserver/pkg/cel/environment"
)

// withoutTransitionRules returns s without the x-kubernetes-validations
// rules a create never runs, or s itself when it has none: rules that
// reference oldSelf without optionalOldSelf (transition rules), which
// kube-apiserver's CEL validator skips when there is no old value. The
// validator still builds the CEL activation of every node that has rules
// before it skips them; a node left without rules gets no validator.
//
// Rules are compiled as cel.NewValidator compiles them (same node
// schemas, the same CEL types along the same walk, the same environment);
// a rule that does not compile, or a node whose rules cannot be compiled,
// keeps its rules, since the validator reports those errors on create
// too. Schemas with allOf are returned as they are.
//
// The validator also reports running out of its cost budget at the next
// node with rules once the rules run so far used it up exactly; a node
// with only transition rules could be that node. So rules are dropped
// only when the estimated worst-case cost of the rules a create runs (and
// their message expressions), times how often each can run, stays below
// the budget: the budget then never runs out on create.
func withoutTransitionRules(s *structuralschema.Structural) *structuralschema.Structural {
	if s == nil || hasAllOf(s) {
		return s
	}
	out := s.DeepCopy()
	var w ruleWalk
	w.drop(out, model.SchemaDeclType(out, true))
	if !w.dropped || w.cost >= celconfig.RuntimeCELCostBudget {
		return s
	}
	return out
}

// ruleWalk removes transition rules, adding up the worst-case costs of
// the rules it keeps.
type ruleWalk struct {
	dropped bool
	cost    uint64 // saturates at math.MaxUint64
}

func (w *ruleWalk) add(cost, times uint64) {
	if times != 0 && cost > (math.MaxUint64-w.cost)/times {
		w.cost = math.MaxUint64
		return
	}
	w.cost += cost * times
}

// drop removes transition rules from n and its children, walking them as
// cel.NewValidator does.
func (w *ruleWalk) drop(n *structuralschema.Structural, declType *apiservercel.DeclType) {
	if len(n.XValidations) > 0 {
		results, err := cel.Compile(n, declType, celconfig.PerCallLimit, environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()), cel.StoredExpressionsEnvLoader())
		if err != nil || len(results) != len(n.XValidations) {
			w.add(math.MaxUint64, 1) // cannot tell: nothing is dropped
		} else {
			kept := n.XValidations[:0]
			for i, r := range results {
				rule := n.XValidations[i]
				if r.Error == nil && r.UsesOldSelf && (rule.OptionalOldSelf == nil || !*rule.OptionalOldSelf) {
					w.dropped = true
					continue
				}
				w.add(r.MaxCost, r.MaxCardinality)
				w.add(r.MessageExpressionMaxCost, r.MaxCardinality)
				kept = append(kept, rule)
			}
			if len(kept) == 0 {
				kept = nil
			}
			n.XValidations = kept
		}
	}
	var elemType *apiservercel.DeclType
	if declType != nil {
		elemType = declType.ElemType
	}
	if n.Items != nil {
		w.drop(n.Items, elemType)
	}
	for name := range n.Properties {
		prop := n.Properties[name]
		var fieldType *apiservercel.DeclType
		if escaped, ok := apiservercel.Escape(name); ok {
			if declType == nil {
				continue
			}
			f, ok := declType.Fields[escaped]
			if !ok {
				continue
			}
			fieldType = f.Type
		} else if fieldType = model.SchemaDeclType(&prop, prop.XEmbeddedResource); fieldType == nil {
			continue
		}
		w.drop(&prop, fieldType)
		n.Properties[name] = prop
	}
	if n.AdditionalProperties != nil && n.AdditionalProperties.Structural != nil {
		w.drop(n.AdditionalProperties.Structural, elemType)
	}
}

// hasAllOf reports whether a node of s has allOf value validations (whose
// rules the CEL validator walks separately).
func hasAllOf(s *structuralschema.Structural) bool {
	return anyNode(s, func(n *structuralschema.Structural) bool {
		return n.ValueValidation != nil && len(n.ValueValidation.AllOf) > 0
	})
}
