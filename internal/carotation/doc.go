// Package carotation rotates the cluster CA in three phases kept in object
// storage (cluster/ca-rotation.json), each a separate, idempotent step that
// may be re-run after an interruption:
//
//   - introduce: a new CA is created (cluster/ca-next.crt, its key sealed at
//     cluster/secret/ca-next.key) and added to the trusted bundle
//     (cluster/ca-bundle.crt); servers keep signing with the old CA but
//     trust both, and hand the bundle to every client they issue a
//     certificate to.
//   - switch: the new CA becomes the signer (cluster/ca.crt and
//     cluster/secret/ca.key; the old certificate is kept as
//     cluster/ca-previous.crt); servers re-issue their own certificate at
//     once and clients get certificates of the new CA at their next renewal.
//   - retire: the old CA leaves the bundle.
//
// Each phase after the first is gated by time, so that nothing still
// depends on what the phase takes away: switch waits until every client
// has renewed once since introduce (the longest client validity of any
// shard), retire until every certificate the old CA signed has expired
// (switch plus that validity plus the servers' refresh grace). Status
// shows the gates; --force skips them.
//
// Only the cluster CA is rotated. The workload CAs (one per tenant,
// internal/workloadca; before them one shared workload CA) are not: no
// Nstance listener trusts them and they sign no control-plane identity, so a
// cluster CA rotation neither needs nor touches them. A tenant's CA is valid
// for certificates.ca_validity from its creation; rotating one (introduce
// into the tenant's bundle, switch the signer, retire) is not built yet.
package carotation
