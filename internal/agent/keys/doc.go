// Package keys generates the key pairs the server asks for in a KeyGenRequest
// (Ed25519, ECDSA P-256/P-384, RSA 2048/4096), stores each private key as a
// PKCS#8 PEM file "<name>.key" in the keys directory (written atomically with
// the configured mode), keeps existing keys whose type still matches, removes
// keys the server no longer lists, and returns the public halves for
// SubmitPublicKeys.
package keys
