// Package store keeps dev-k8s objects in memory, mirrors them to JSON files
// ({dir}/{resource}/{namespace}/{name}.json, or {dir}/{resource}/{name}.json
// for cluster-scoped kinds), hands out a cluster-wide resourceVersion that
// survives restarts, fans out watch events from a bounded history, and turns
// hand edits of the files (seen through fsnotify) into watch events. Every
// file operation goes through an os.Root on the data directory, symlinks are
// not followed, and namespaces and names that are not safe file names (or
// that the server's naming rules refuse) are skipped.
package store
