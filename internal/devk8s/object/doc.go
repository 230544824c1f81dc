// Package object holds the small helpers dev-k8s uses over unstructured
// (map) Kubernetes objects: reading nested fields, metadata, defaults and
// the spec comparison behind metadata.generation. The apiserver and the
// per-resource strategies share them.
package object
