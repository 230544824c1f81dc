// Package app is nstance-server: the one place it is assembled and run
// (tests bind every port on 127.0.0.1:0 and read the addresses back with
// Addrs).
//
// Assemble (assemble.go) builds everything a shard server serves and runs
// from the loaded config and the cluster material: the live config, the
// provider (NewProvider, or Options.Provider), instance records, groups,
// events, the reconciler (the shard leader's work, Assembly.Lead), and the
// Registration, Operator and Agent services. Tests configure it through
// typed Options (Provider, Local, Tuning), never by swapping constructors.
//
// Run (app.go) is the start-up sequence: bind the health port (503) -> load
// config/{shard}.jsonc with backoff -> open the SQLite cache and sync it
// (health 200) -> campaign for cluster leadership -> bootstrap the cluster CA
// and nonce key (the cluster leader creates them) -> issue this server's TLS
// certificate -> serve the election status over HTTPS -> Assemble ->
// campaign for shard leadership. While leading the shard (leadShard) it
// rebuilds the cache from storage, serves the three gRPC listeners and runs
// Assembly.Lead; on losing the lease it closes them at once. Cancelling the
// Run context shuts down gracefully and releases leases.
package app
