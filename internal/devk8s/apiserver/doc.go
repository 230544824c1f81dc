// Package apiserver is the HTTP side of dev-k8s: discovery, CRUD, list and
// watch with selectors, patches, deletion with finalizers and garbage
// collection, pod eviction with PodDisruptionBudgets, TokenRequest and Table
// output, all answering like kube-apiserver with JSON bodies.
package apiserver
