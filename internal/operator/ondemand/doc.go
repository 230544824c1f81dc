// Package ondemand turns pods annotated with on-demand.nstance.dev/group
// into a Machine plus NstanceMachine (one dedicated instance per pod) and
// removes them when the pod goes away. The pods are those of the workload
// cluster (package workload); the Machines live in the operator's namespace.
package ondemand
