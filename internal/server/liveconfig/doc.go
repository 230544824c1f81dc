// Package liveconfig holds the shard config the server runs and refreshes it
// from object storage (config/{shard}.jsonc): download, compare etags,
// validate, then swap atomically. An invalid or unreadable config is never
// applied; the running one stays in place and the outcome says why.
package liveconfig
