// Package devs3 is the dev-s3 server: an S3 API (gofakes3) whose single
// bucket is a directory of plain files (pkg/objstore/fsbucket), with atomic
// conditional writes (If-None-Match: *, If-Match: <etag>) on PUT and on
// CompleteMultipartUpload, multipart uploads kept on disk and expired when
// abandoned, optional AWS Signature Version 4 checking, aws-chunked request
// bodies, path-safety checks in front of every request, GET /healthz,
// request logging through logr and graceful shutdown.
package devs3
