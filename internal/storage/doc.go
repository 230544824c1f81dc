// Package storage opens the object store the server and admin CLI use (S3
// through the AWS SDK environment, or a local directory) and retries storage
// operations with capped exponential backoff.
package storage
