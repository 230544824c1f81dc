// Package app wires dev-k8s together: it opens the API server on a data
// directory, listens (127.0.0.1:6443 unless told otherwise; TLS with a
// generated CA, or plain HTTP), writes the admin kubeconfig into the data
// directory (and optionally a copy) and shuts down cleanly when the context
// ends.
package app
