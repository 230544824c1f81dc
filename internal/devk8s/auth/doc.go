// Package auth authenticates dev-k8s requests the way kube-apiserver does
// with bearer-token authentication: a generated admin token (kept in the
// data directory so restarts keep it), an optional static token file in
// kube-apiserver's --token-auth-file CSV format, and ServiceAccount tokens
// issued by the TokenRequest API. Anonymous requests are allowed only on
// /healthz, /livez, /readyz and /version (like an AuthenticationConfiguration
// whose anonymous conditions name those paths); a missing token elsewhere,
// or any unknown token, is answered 401 Unauthorized.
package auth
