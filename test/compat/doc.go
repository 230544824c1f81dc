// Package compat runs the server's storage layer against object stores we
// did not write, each built from the Go module proxy (pinned in
// scripts/tools/<name>, built by internal/testing/toolbin into
// ~/.cache/nstance/tools) and started as its own process on loopback:
// Versity Gateway (posix backend), SeaweedFS and MinIO over S3, and
// fake-gcs-server over the GCS JSON API. For each one it runs
//
//   - the start-up probe (storage.ProbeConditionalWrites), which the server
//     runs before anything else and which refuses a store without
//     conditional writes;
//   - the objstore contract (objstoretest.Run: conditional create and
//     replace, list, delete, bodies up to 6 MiB, 20 racing creates);
//   - an election: two electors (internal/server/election, real clocks)
//     on one lease object, the leader cut off from storage twice; exactly
//     one leads at any moment and the overlap (the new leader starting
//     before the old one stopped) is measured and must be zero.
//
// The S3 servers are started by internal/testing/s3servers, which test/chaos
// (TestLeaderCutOffFromOtherStores: two nstance-server processes) shares.
// `make compat` (NSTANCE_COMPAT=1) builds what is missing and runs every
// store. Without it, `go test` (and so `make test`) runs fake-gcs-server and
// Versity Gateway only when its build is already cached, and says so when
// it skips. docs/storage-compat.md holds the table of results.
package compat
