// Package gcsstore is the objstore.Store backend for Google Cloud Storage,
// built on cloud.google.com/go/storage (JSON API over HTTP).
//
// ETags are the hex MD5 of the body, as for S3 and the other backends, so
// records and caches compare the same way on every store. The conditions map
// onto GCS generations: a create-only write carries the DoesNotExist
// precondition (ifGenerationMatch=0); a replace with IfMatch reads the
// object's attributes, checks that its MD5 is the ETag given and writes with
// ifGenerationMatch=<the generation read>, so a writer that got in between
// makes the write fail with 412 instead of being overwritten.
//
// New uses Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS,
// the metadata server on GCE) and honours STORAGE_EMULATOR_HOST (no
// credentials, an emulator such as fake-gcs-server), as the client library
// does. The service account needs storage.objects.get, .list, .create and
// .delete on the bucket (roles/storage.objectUser).
package gcsstore
