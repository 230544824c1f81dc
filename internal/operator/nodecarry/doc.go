// Package nodecarry carries the labels and taints a user put on a pool's
// Node to the Node of the instance that replaces it (rotation, unhealthy,
// deleted Machine). Decide pairs departed members with their successors and
// says what each successor lacks; the Runner lists the shards' instances and
// the workload Nodes, patches the Nodes and keeps the pending entries in the
// pool's nstance.dev/carry annotation. Which keys are carried is the operator
// config's carry_label_prefixes and carry_taint_prefixes.
package nodecarry
