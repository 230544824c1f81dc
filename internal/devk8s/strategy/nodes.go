package strategy

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nstance-dev/nstance/internal/devk8s/object"
	"github.com/nstance-dev/nstance/internal/devk8s/registry"
)

// Nodes are core v1 Nodes.
type Nodes struct{ Generic }

// Resource is the registry entry.
func (Nodes) Resource() registry.Resource {
	return registry.Resource{Version: "v1", Resource: "nodes", Kind: "Node", ShortNames: []string{"no"}, Status: true, BuiltIn: true, Storage: true}
}

// PrepareForCreate adds the not-ready taint, as the TaintNodesByCondition
// admission plugin marks new nodes.
func (Nodes) PrepareForCreate(_ *registry.Resource, obj map[string]any) {
	spec := object.ChildMap(obj, "spec")
	taints := object.List(spec["taints"])
	for _, t := range taints {
		if m, _ := t.(map[string]any); object.Str(m, "key") == "node.kubernetes.io/not-ready" {
			return
		}
	}
	spec["taints"] = append(taints, map[string]any{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})
}

// Default fills spec.podCIDRs from spec.podCIDR.
func (Nodes) Default(_ *registry.Resource, obj map[string]any) {
	if spec, _ := obj["spec"].(map[string]any); spec != nil {
		if cidr := object.Str(spec, "podCIDR"); cidr != "" {
			if _, ok := spec["podCIDRs"]; !ok {
				spec["podCIDRs"] = []any{cidr}
			}
		}
	}
}

// PrepareForStatusUpdate resets only the spec, as kube-apiserver's Node
// status strategy does: a status write may change labels and annotations
// (the kubelet sets its default labels on an existing Node that way).
func (Nodes) PrepareForStatusUpdate(cur, obj map[string]any) map[string]any {
	if sp, ok := cur["spec"]; ok {
		obj["spec"] = sp
	} else {
		delete(obj, "spec")
	}
	return obj
}

// Fields are the Node field selectors.
func (Nodes) Fields() []Field { return []Field{boolField("spec.unschedulable")} }

// Columns are kubectl's Node columns.
func (Nodes) Columns() []Column {
	return withNameAge(
		Column{Def: metav1.TableColumnDefinition{Name: "Status", Type: "string"}, Cell: nodeStatus},
		Column{Def: metav1.TableColumnDefinition{Name: "Roles", Type: "string"}, Cell: func(map[string]any) any { return "<none>" }},
		pathCol("Version", "string", 0, "status", "nodeInfo", "kubeletVersion"),
	)
}

func nodeStatus(o map[string]any) any {
	status := "Unknown"
	conds, _ := object.Nested(o, "status", "conditions")
	list, _ := conds.([]any)
	for _, c := range list {
		m, _ := c.(map[string]any)
		if object.Str(m, "type") == "Ready" {
			if object.Str(m, "status") == "True" {
				status = "Ready"
			} else {
				status = "NotReady"
			}
		}
	}
	if u, _ := object.Nested(o, "spec", "unschedulable"); u == true {
		status += ",SchedulingDisabled"
	}
	return status
}
