// Package apiserver is the HTTP side of dev-k8s: discovery, CRUD, list and
// watch with selectors, patches, deletion with finalizers and garbage
// collection, pod eviction with PodDisruptionBudgets, TokenRequest and Table
// output, all answering like kube-apiserver with JSON bodies. What differs
// between resources comes from their strategy (package strategy), looked up
// by resource; the apiserver has no per-resource switch of its own.
package apiserver
