// Package ondemand turns pods annotated with on-demand.nstance.dev/group
// into a Machine plus NstanceMachine (one dedicated instance per pod) and
// removes them when the pod goes away. The pods are those of the workload
// cluster (package workload); the Machines live in the operator's namespace.
//
// Creating a Pod launches a VM, so a pod is admitted only within the rules
// of Decide (policy.go, a pure function): an allowed namespace (the
// operator's on_demand_namespaces, by default its own namespace), a pool of
// the group that opts in (NstanceMachinePool spec.onDemand.enabled), an
// allowed instance type, one of the pool's shards, and room below the pool's
// spec.onDemand.maxInstances. A refused pod gets a Warning Event
// (ReasonRefused) naming the rule, and nothing is created.
package ondemand
