// Package files writes the files the server delivers to the agent into one
// directory, safely and atomically. Every path is checked before anything is
// touched: absolute paths, ".." components, symbolic links anywhere on the
// path and contents above the size limit are refused, and all file system
// access goes through an os.Root so nothing can be created outside the
// directory. A file is written to a temporary sibling, synced, given its mode
// and renamed into place, so readers see either the old or the new content.
// The outcome of every delivered file is kept for the next health report.
package files
