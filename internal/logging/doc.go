// Package logging is the one logging set-up shared by every Nstance binary:
// the --log-level and --log-format flags (each with an environment variable
// named after the binary's prefix, e.g. NSTANCE_LOG_LEVEL or DEV_K8S_LOG_FORMAT),
// and a zap-backed logr.Logger built from them.
//
// Levels are debug, info, warn and error, or a number N that enables V(N)
// messages. Formats are json (the default when stderr is not a terminal, so in
// every container image), text (the default on a terminal) and auto. Stack
// traces are never attached: routine problems (a hand-edited file with a typo,
// a peer that went away) are logged as one line each.
package logging
