// Package shardtest runs a real nstance-server shard (app.App: config from
// storage, elections, bootstrap, the assembled services and reconciler
// behind the real TLS/mTLS listeners) in-process for tests, on a file store
// (dirstore) in a temporary directory by default (any objstore.Store, e.g.
// an s3store against dev-s3), with the mock provider by default (any
// provider may be passed, e.g. the process provider running real agents).
// The cluster CA and workload CA may be given (written to storage before the
// server starts); otherwise bootstrap creates them and Start reads them back
// for the tests, with the nonce key.
//
//	sh := shardtest.Start(t, shardtest.Options{})
//	client := sh.Client(t, "acme")           // operator certificate for tenant acme
//	client.UpsertGroup(ctx, ...)
//
// Everything started is stopped by t.Cleanup.
package shardtest
