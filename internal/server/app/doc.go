// Package app wires nstance-server together and can run it in-process (tests
// bind every port on 127.0.0.1:0 and read the addresses back with Addrs).
//
// Start-up: bind the health port (503) -> load config/{shard}.jsonc with
// backoff -> open the SQLite cache and sync it (health 200) -> campaign for
// cluster leadership -> bootstrap the cluster CA and nonce key (the cluster
// leader creates them) -> issue this server's TLS certificate -> serve the
// election status over HTTPS -> campaign for shard leadership. While leading
// the shard it rebuilds the cache from storage and serves the Registration,
// Operator and Agent gRPC listeners; on losing the lease it closes them at
// once. Cancelling the Run context shuts down gracefully and releases leases.
package app
