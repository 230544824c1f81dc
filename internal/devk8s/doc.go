// Package devk8s groups the parts of dev-k8s, a development Kubernetes API
// server whose objects are plain JSON files: registry (which resources are
// served), store (files, resourceVersions, watch events, fsnotify), apiserver
// (the HTTP API), auth (bearer-token authentication) and certs (TLS and
// kubeconfig output).
package devk8s
