// Package cmdutil holds what every nstance-admin command shares: the
// logging flags (NSTANCE_LOG_LEVEL, NSTANCE_LOG_FORMAT) and the logger they
// configure, which always writes to stderr so it never mixes with the
// JSON or YAML a command prints on stdout.
package cmdutil
