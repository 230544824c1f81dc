// Package devk8s groups the parts of dev-k8s, a development Kubernetes API
// server whose objects are plain JSON files: registry (which resources are
// served), strategy (each built-in resource's rules: defaults, validation,
// status and generation handling, field selectors, table columns, deletion,
// controllers), object (helpers over unstructured objects), store (files,
// resourceVersions, watch events, fsnotify), apiserver (the HTTP API), auth
// (bearer-token authentication) and certs (TLS and kubeconfig output).
package devk8s
