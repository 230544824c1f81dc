// Package hosttools lets a test state which programs of the host it runs
// (tmux, the aws CLI, make, ...). A missing program fails the test, never
// skips it, with the program's name and how to install it: `make test` must
// not turn green on a machine that cannot run everything. `.ci/run` installs
// each of them on Debian when it is missing.
package hosttools
