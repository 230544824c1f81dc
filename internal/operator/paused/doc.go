// Package paused is the operator's thin layer over Cluster API's
// util/paused: it finds the Cluster an object belongs to, sets the Paused
// condition through paused.EnsurePausedCondition, and wires the Cluster
// watch that brings objects back the moment their Cluster is paused or
// unpaused. Check serves the paths that own no condition (drain, on-demand
// pods, the importer, cluster object creation).
package paused
