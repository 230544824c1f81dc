// Package nodejoin enforces the join deadline: an instance whose agent has
// reported (InstanceStatus.first_health_at) must have a Kubernetes Node with
// its provider ID that is Ready within the join timeout, or the operator
// marks it (Warning Event, NodeJoined=False/JoinTimeout on its NstanceMachine
// or, without one, on its NstanceMachinePool) and deletes it with skip_drain
// so that it is replaced. It also reports, once per Node, a Node whose
// provider ID has this cluster's nstance:// prefix but names no instance any
// shard reports. It never deletes Nodes.
//
// Decide is the whole policy as a pure function; Runner applies it
// periodically, as a leader-only controller-runtime Runnable, through the
// operator's shard connections and its workload-cluster access.
//
// Join and health are kept apart: an instance whose Node was Ready once
// (seen by the Runner, or recorded as NodeJoined=True on its NstanceMachine)
// has joined, and a Node going NotReady later is a health matter (the
// server's health checks, a MachineHealthCheck), never a join failure. After
// an operator restart, with nothing recorded, a NotReady Node counts as
// never joined only while its Ready condition has not changed since the
// deadline (or it has none): a transition after the deadline means the
// history is unknown and the instance is left alone.
package nodejoin
