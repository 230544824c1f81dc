// Package identity manages the agent's identity directory: the one-time
// registration nonce and cluster CA placed there by the provider, the agent's
// own Ed25519 key (generated once and kept, so a crash between key and
// certificate resumes with the same key), the client certificate and CA chain
// returned by registration, and the mTLS client configuration built from them.
package identity
