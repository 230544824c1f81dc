// Package auth authenticates dev-k8s requests the way kube-apiserver does,
// with the apiserver library's own authenticators: a generated admin token
// (kept in the data directory so restarts keep it), an optional static token
// file in kube-apiserver's --token-auth-file CSV format, ServiceAccount
// tokens issued by the TokenRequest API, and, with a client CA file, x509
// client certificates (user from the CommonName, groups from the
// Organizations, as --client-ca-file). Certificates are tried before tokens
// and the first credential that authenticates wins, as in kube-apiserver's
// union. The CA file is reloaded when it changes and may appear after the
// server started. Anonymous requests are allowed only on /healthz, /livez,
// /readyz and /version (like an AuthenticationConfiguration whose anonymous
// conditions name those paths); a missing credential elsewhere, or any
// credential that does not verify (unknown token, certificate from another
// CA, expired certificate), is answered 401 Unauthorized.
package auth
