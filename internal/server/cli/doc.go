// Package cli is the nstance-server command line: flags (also read from
// NSTANCE_* environment variables), logging, --validate, and running the app
// until SIGINT/SIGTERM.
package cli
