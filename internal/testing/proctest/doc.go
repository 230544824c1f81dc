// Package proctest runs the repository's binaries as child processes for
// the black-box suites (test/e2e, test/attack, test/chaos), and holds the
// pieces every such stack needs:
//
//   - Binaries: one `go build` of the commands a suite needs, into one
//     directory per test binary (commands asked for later are built then,
//     into the same directory), removed when the test binary ends
//     (Binaries.Main).
//   - Start and Group: each child in its own process group, its stdout and
//     stderr in a log file, stopped by its PID only (SIGTERM to the group,
//     SIGKILL after a grace period). A Group stops its processes in reverse
//     start order at the test's cleanup and, when the test failed, prints the
//     tail of every log.
//   - StopRecorded: ends the agents the process provider started, by the
//     PIDs it recorded (checking each PID still names the recorded process).
//   - Wait, Eventually and Proc.WaitFor: poll a condition (HTTPOK, Dialable,
//     Exists, LogContains) until it holds, naming what was awaited when it
//     does not; Proc.WaitFor also gives up when the process exits, with its
//     log's tail.
//   - WriteFile, WriteJSON, S3Env, OperatorConfig, CRDDirs and Output: the
//     files, environment and commands the stacks share.
//
// Free loopback ports come from portpick. What a suite runs and with which
// configuration stays in the suite.
package proctest
