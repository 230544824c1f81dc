// Package nodedrain drains the pods of one Node, in the shape of Cluster
// API's machine drain helper: small filters decide per pod what the drain
// does with it (leave it, wait for it, evict it), and an executor posts the
// evictions through the Eviction API.
//
// A Helper makes one non-blocking pass: it cordons the Node, evicts every
// pod the filters let through (a few at a time), and reports how many pods
// still hold the Node and which evictions a PodDisruptionBudget refused
// (429). It never waits or retries by itself: the caller (package drain)
// runs the next pass on its own schedule and applies the drain deadline.
//
// The rules are those of `kubectl drain --ignore-daemonsets --force
// --delete-emptydir-data`: mirror pods, finished pods and pods of an
// existing DaemonSet are left alone; terminating pods are waited for;
// everything else, unmanaged pods and pods with emptyDir volumes included,
// is evicted.
package nodedrain
