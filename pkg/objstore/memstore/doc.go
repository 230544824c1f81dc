// Package memstore is an in-memory objstore.Store for unit tests. It applies
// the same key rules and conditional-write semantics as the other backends.
package memstore
