// Package secrets encrypts secrets at rest in object storage with
// AES-256-GCM under the 32-byte cluster encryption key (NSTANCE_ENCRYPTION_KEY).
//
// Each stored secret is a small JSON envelope carrying a version, the id of the
// key that sealed it, the GCM nonce and the ciphertext. The secret's logical
// name is bound in as additional authenticated data, so an envelope copied to
// another name does not decrypt. A Keyring holds the current key (used for
// every new write) and any number of previous keys that are still accepted for
// decryption, which is how the key is rotated.
//
// A key is given as 32 raw bytes, 64 hex characters or base64 of 32 bytes;
// any other length is refused. A key whose 32 bytes are all printable text
// (a passphrase rather than random bytes) is accepted but marked Printable so
// the server can warn about it outside development.
package secrets
