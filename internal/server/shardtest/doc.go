// Package shardtest starts a fake nstance-server shard in-process for other
// packages' tests. It is the real server code — object storage, config
// holder, instance store, groups, reconciler and the Operator gRPC service
// behind the real mTLS listener and role interceptors — with a test CA, the
// mock provider by default (any provider may be passed) and in-memory object
// storage by default (any objstore.Store, e.g. an s3store against dev-s3).
//
//	sh := shardtest.Start(t, shardtest.Options{})
//	client := sh.Client(t, "acme")           // operator certificate for tenant acme
//	client.UpsertGroup(ctx, ...)
//
// Everything started is stopped by t.Cleanup.
package shardtest
