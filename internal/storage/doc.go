// Package storage opens the object store the server and admin CLI use (S3
// through the AWS SDK environment, or a local directory) and retries storage
// operations with capped exponential backoff. ReplaceIfMatch and CreateOnly
// make conditional writes safe to retry; ProbeConditionalWrites refuses a
// store that ignores If-None-Match or If-Match.
//
// storage is a shared leaf package (docs/architecture.md, "Import rule";
// checked by test/imports): it imports only internal/layout.
package storage
