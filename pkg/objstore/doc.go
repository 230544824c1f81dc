// Package objstore defines the small object-storage interface that every
// Nstance binary uses for durable state, plus the key rules shared by all
// backends.
//
// Backends live in subpackages: s3store (any S3 API, including dev-s3),
// dirstore (a local directory, one plain file per key), and memstore (in
// memory, for unit tests). objstoretest holds the contract suite that every
// backend must pass.
package objstore
