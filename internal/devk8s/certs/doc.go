// Package certs creates and keeps the certificate authority and serving
// certificate dev-k8s uses for TLS, and writes kubeconfig files pointing
// clients at the server.
package certs
