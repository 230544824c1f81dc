// Package identity manages the agent's identity directory: the one-time
// registration nonce and cluster CA placed there by the provider, the agent's
// own Ed25519 key (generated once and kept, so a crash between key and
// certificate resumes with the same key), the client certificate and CA chain
// returned by registration, and the mTLS client configuration built from them.
// Every write is a synced temporary file renamed into place followed by a
// sync of the directory, and the nonce is removed only after the certificate
// is durably stored. Servers are verified by the cluster CA and by their
// server identity (pki.VerifyServerConnection).
package identity
