// Package ondemand turns pods annotated with on-demand.nstance.dev/group
// into a Machine plus NstanceMachine (one dedicated instance per pod) and
// removes them when the pod goes away.
package ondemand
