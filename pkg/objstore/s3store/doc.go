// Package s3store is the objstore.Store backend for the S3 API (AWS S3 or
// dev-s3), built on aws-sdk-go-v2.
//
// New reads the standard AWS environment through config.LoadDefaultConfig
// (AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
// ...), defaults the region to us-east-1, and additionally honours
// AWS_S3_USE_PATH_STYLE=true, which the SDK itself does not read.
package s3store
