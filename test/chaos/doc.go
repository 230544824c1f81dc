// Package chaos holds fault-injection tests against real nstance-server
// processes on dev-s3 (and, TestLeaderCutOffFromOtherStores, on the object
// stores of test/compat): a TCP proxy between each server and storage that can
// blackhole traffic, SIGSTOP/SIGCONT and kill -9 of processes. The short
// variants run in `make test`; `make chaos` sets CHAOS_RUNS and
// CHAOS_FREEZE for the long ones. Each server gets its own loopback address
// (127.X.Y.N with the standard ports), so no port is reserved by
// listen-and-close.
package chaos
