// Package store keeps dev-k8s objects in memory, mirrors them to JSON files
// ({dir}/{resource}/{namespace}/{name}.json, or {dir}/{resource}/{name}.json
// for cluster-scoped kinds), hands out a cluster-wide resourceVersion that
// survives restarts, fans out watch events from a bounded history, and turns
// hand edits of the files (seen through fsnotify) into watch events.
package store
