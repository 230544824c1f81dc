// Package dirstore is the objstore.Store backend over a local directory: each
// key is a plain file (see fsbucket for the layout, shared with dev-s3).
//
// Conditional writes are atomic across goroutines, across Store values on the
// same directory and across processes on one host (flock on a local file
// system). They are not safe across hosts sharing the directory over NFS or
// similar; use S3 there.
package dirstore
