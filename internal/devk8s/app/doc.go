// Package app wires dev-k8s together: it opens the API server on a data
// directory, listens (TLS with a generated CA, or plain HTTP), writes the
// kubeconfig and shuts down cleanly when the context ends.
package app
