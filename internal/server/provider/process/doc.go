// Package process is a provider that runs each instance's agent as a plain
// child process, for tests and CI where tmux is not wanted. Every child runs
// in its own process group (killed as a whole on delete) with its identity
// files in {StateDir}/{instanceID}/identity and its output in
// {StateDir}/{instanceID}/agent.log.
//
// The PID and kernel start time of each child are recorded in
// {StateDir}/{instanceID}/process.json. A new Provider over the same StateDir
// (a restarted server) re-adopts every recorded process that is still alive
// with the same start time, so a restart creates no duplicates; a recorded
// process that is gone is reported as stopped until it is deleted.
//
// The provider keeps no descriptor or thread per child: a child is reaped
// with a non-blocking wait4 when its liveness is checked (every status,
// list and delete), so an exited child stays a zombie only until then.
package process
