// Package revocation is the deny list of control-plane client certificates.
//
// An Entry names certificates by serial, or by identity (an operator id, or
// an instance id on a shard) issued no later than a point in time, so a later
// registration of the same id is not caught. Entries are persisted (create
// only) under cluster/revocations/ (operator and admin identities, serials:
// operator certificates are valid on every shard) and
// shard/{shard}/revocations/ (agent identities of the shard's instances), so
// every server of the shard and the next leader load them, and are removed
// once every certificate they can name has expired.
//
// The Gate holds the loaded entries and implements authz.Gate: the mTLS
// listeners consult it at each handshake and on each RPC, and streams it
// admitted are cancelled as soon as an entry matching their certificate
// arrives. Sync re-reads storage and also turns an operator record that
// disappeared (deleted by hand) into an entry for that operator.
package revocation
