// Package nonce mints and verifies registration nonces: EdDSA-signed JWTs
// (Ed25519 only; "none", HMAC and every other algorithm are refused) whose
// claims name the kind of client (agent or operator), subject, cluster,
// tenant and, for agents, shard and group. A Ledger makes each nonce single-use
// by creating a marker object with If-None-Match in object storage, so a
// replay fails on every server even after a cache wipe; the marker holds the
// registering key's fingerprint and the certificate issued, so the same key
// retrying gets that certificate back. A Sweeper deletes each marker once its
// own nonce has expired (the marker's expires_at, whatever lifetime the
// sweeping server accepts); markers without one are kept for a fixed
// maximum lifetime.
package nonce
