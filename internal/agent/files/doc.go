// Package files writes the files the server delivers to the agent into one
// directory, safely and atomically. Every path is checked before anything is
// touched: absolute paths, ".." components, symbolic links anywhere on the
// path and contents above the size limit are refused, and all file system
// access goes through an os.Root so nothing can be created outside the
// directory. A file is written to a temporary sibling, synced, given its mode
// and renamed into place (then the directory is synced), so readers see
// either the old or the new content.
//
// Modes are capped: no delivered file is group- or world-writable (at most
// 0755) and secrets are owner-only (at most 0600). A delivery is the
// instance's complete file set, so files written earlier that are neither
// delivered nor pending any more are removed, together with directories that
// became empty; a manifest beside the directory remembers what was written
// across restarts. Removal never follows a symbolic link. The outcome of every
// delivered file is kept for the next health report.
package files
