// Package e2e exercises a running dev-k8s the way its users do: kubectl,
// client-go over TLS with the written kubeconfig, a controller-runtime
// manager, and the built-in controllers. It holds only tests.
package e2e
