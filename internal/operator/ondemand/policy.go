package ondemand

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/utils/ptr"

	infrav1 "github.com/nstance-dev/nstance/api/v1beta1"
)

// Request is what an annotated pod asks for.
type Request struct {
	// Namespace is the pod's namespace.
	Namespace string
	// Group, InstanceType and Shard are its annotations (the last two
	// optional).
	Group, InstanceType, Shard string
}

// Policy is the operator's side of the decision.
type Policy struct {
	// Namespaces may hold on-demand pods; empty means OperatorNamespace only.
	Namespaces []string
	// OperatorNamespace is the operator's own namespace (NSTANCE_NAMESPACE).
	OperatorNamespace string
}

// Refusal kinds, for logs and tests; the Event carries the message.
const (
	RefusedNamespace    = "Namespace"
	RefusedNoPool       = "NoPool"
	RefusedNotEnabled   = "NotEnabled"
	RefusedInstanceType = "InstanceType"
	RefusedShard        = "Shard"
	RefusedMaxInstances = "MaxInstances"
)

// Decision is the outcome for one pod: either Refused (with a message naming
// the rule) or the pool, instance type and shard of its instance.
type Decision struct {
	// Refused is empty when the pod may have its instance, else one of the
	// Refused* kinds.
	Refused string
	// Message explains a refusal.
	Message string
	// Pool is the pool whose group the instance joins.
	Pool string
	// InstanceType is the NstanceMachine's override ("" for the group's).
	InstanceType string
	// Shard is where the instance is created.
	Shard string
}

// AllowedNamespaces returns the namespaces that may hold on-demand pods.
func (p Policy) AllowedNamespaces() []string {
	if len(p.Namespaces) == 0 {
		return []string{p.OperatorNamespace}
	}
	return p.Namespaces
}

// NamespaceAllowed reports whether pods of ns may ask for on-demand
// instances.
func (p Policy) NamespaceAllowed(ns string) bool {
	return slices.Contains(p.AllowedNamespaces(), ns)
}

func refuse(kind, format string, args ...any) Decision {
	return Decision{Refused: kind, Message: fmt.Sprintf(format, args...)}
}

// Decide says whether req may have an on-demand instance. pools are the
// NstanceMachinePools of the operator's namespace; onDemandCount is the
// number of on-demand NstanceMachines of req.Group that exist already (not
// counting this pod's). The rules, in this order: the pod's namespace is
// allowed; exactly one pool has the group and is not being deleted; it
// opts in (spec.onDemand.enabled); the instance type is the group's, the
// pool's spec.instanceType or one of spec.onDemand.allowedInstanceTypes;
// the shard is one of the pool's shards (default: its first); and the group
// has fewer than spec.onDemand.maxInstances on-demand instances.
func Decide(p Policy, req Request, pools []infrav1.NstanceMachinePool, onDemandCount int) Decision {
	if !p.NamespaceAllowed(req.Namespace) {
		return refuse(RefusedNamespace, "namespace %q may not ask for on-demand instances (allowed namespaces: %s; operator setting on_demand_namespaces)",
			req.Namespace, strings.Join(p.AllowedNamespaces(), ", "))
	}
	var matching []*infrav1.NstanceMachinePool
	for i := range pools {
		if pools[i].Spec.Group == req.Group {
			matching = append(matching, &pools[i])
		}
	}
	switch {
	case len(matching) == 0:
		return refuse(RefusedNoPool, "no NstanceMachinePool with group %q in namespace %s", req.Group, p.OperatorNamespace)
	case len(matching) > 1:
		names := make([]string, 0, len(matching))
		for _, m := range matching {
			names = append(names, m.Name)
		}
		return refuse(RefusedNoPool, "group %q belongs to more than one NstanceMachinePool (%s)", req.Group, strings.Join(names, ", "))
	}
	pool := matching[0]
	if !pool.DeletionTimestamp.IsZero() {
		return refuse(RefusedNoPool, "NstanceMachinePool %s of group %q is being deleted", pool.Name, req.Group)
	}
	od := pool.Spec.OnDemand
	if od == nil || !od.Enabled {
		return refuse(RefusedNotEnabled, "NstanceMachinePool %s does not accept on-demand pods (spec.onDemand.enabled is not true)", pool.Name)
	}
	if t := req.InstanceType; t != "" && t != pool.Spec.InstanceType && !slices.Contains(od.AllowedInstanceTypes, t) {
		allowed := slices.Clone(od.AllowedInstanceTypes)
		if pool.Spec.InstanceType != "" {
			allowed = append([]string{pool.Spec.InstanceType}, allowed...)
		}
		return refuse(RefusedInstanceType, "instance type %q is not allowed for on-demand pods of NstanceMachinePool %s (allowed: %s; spec.instanceType and spec.onDemand.allowedInstanceTypes)",
			t, pool.Name, listOrNone(allowed, "only the group's own type, without the annotation"))
	}
	shard := req.Shard
	if shard == "" && len(pool.Spec.Shards) > 0 {
		shard = pool.Spec.Shards[0]
	}
	if !slices.Contains(pool.Spec.Shards, shard) {
		return refuse(RefusedShard, "shard %q is not one of NstanceMachinePool %s's shards (%s)", shard, pool.Name, listOrNone(pool.Spec.Shards, "none"))
	}
	if limit := ptr.Deref(od.MaxInstances, infrav1.DefaultOnDemandMaxInstances); onDemandCount >= int(limit) {
		return refuse(RefusedMaxInstances, "NstanceMachinePool %s has %d on-demand instances, spec.onDemand.maxInstances is %d", pool.Name, onDemandCount, limit)
	}
	return Decision{Pool: pool.Name, InstanceType: req.InstanceType, Shard: shard}
}

func listOrNone(l []string, none string) string {
	if len(l) == 0 {
		return none
	}
	return strings.Join(l, ", ")
}
