// Package paused decides whether Cluster API has paused reconciliation of an
// object: the cluster.x-k8s.io/paused annotation on any of the objects
// involved, or spec.paused on the Cluster they belong to.
package paused
