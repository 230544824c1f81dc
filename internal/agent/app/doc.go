// Package app wires the agent together: identity directory, registration,
// key store, file writer, health sampler and the session loop. It runs until
// its context ends (the binary cancels it on SIGINT/SIGTERM).
package app
