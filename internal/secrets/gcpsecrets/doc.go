// Package gcpsecrets reads encryption keys from Google Secret Manager
// (AccessSecretVersion: the payload is the raw key or its hex or base64
// text; version_id picks a version, default "latest", so the previous key
// of a rotation names its version number). It implements secrets.Remote for
// the provider gcp-secret-manager behind the small AccessAPI interface the
// cloud.google.com/go/secretmanager client satisfies. The only permission
// used is secretmanager.versions.access (roles/secretmanager.secretAccessor
// on the secret).
package gcpsecrets
