// Package fsbucket is the storage engine behind dev-s3 and objstore/dirstore:
// one directory is one bucket, and the object with key "a/b.txt" is the plain
// file <dir>/a/b.txt, so files can be read and written by hand.
//
// Layout inside the directory:
//
//	<key>                          object bodies, as plain files
//	.dev-s3/meta/<key>.meta        sidecar: MD5, stored metadata and the identity
//	                               (inode, size, mtime) of the body it describes
//	.dev-s3/locks/<nn>             flock(2) files, one per lock stripe
//	.dev-s3/spare/.dev-s3-tmp-*    in-flight writes, renamed into place, and
//	                               replaced bodies kept for reuse (spare.go)
//
// The .dev-s3 tree and temp files are never listed as objects and cannot be
// addressed by keys. A body without a matching sidecar (written by hand, or
// edited since) is served with an MD5 computed from its content.
//
// Writes are atomic (temp file, then rename or RENAME_EXCHANGE). Readers
// take a shared flock on the body they read, so a replaced body that is
// reused for a later write is never rewritten under a Bucket reader. Writes and
// deletes of a key are serialised by a striped flock on a lock file, so
// conditional writes are atomic between goroutines, between Bucket values on
// the same directory and between processes on the same host, as long as the
// directory is on a local file system that supports flock (not NFS). Bodies
// are not fsynced: this is a development store.
package fsbucket
