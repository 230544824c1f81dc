// Package version holds the build version stamped by the Makefile's ldflags.
package version

// Version is set at link time with
// -X github.com/nstance-dev/nstance/internal/version.Version=<git describe>.
// It is a var only because the linker can set nothing else.
var Version = "dev"
