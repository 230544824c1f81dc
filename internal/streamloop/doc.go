// Package streamloop follows a server stream: it reopens the stream each
// time it ends, spaced by jittered exponential backoff (apimachinery's
// wait.Backoff) that starts over once a stream has lived a while, waits for
// the connection before each attempt and reports every reopening (the
// reconnect metric). The operator's group, error and instance watches and
// nstance-admin's status watches all run in it.
package streamloop
