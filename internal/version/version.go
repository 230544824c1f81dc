// Package version holds the build version of every Nstance binary: the one
// stamped by the Makefile's ldflags, or else the one the Go toolchain
// recorded in the module build information (`go install ...@v0.3.0` gives
// v0.3.0; a build in a git checkout gives a pseudo-version and the commit).
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Version is set at link time with
// -X github.com/nstance-dev/nstance/internal/version.Version=<git describe>;
// when it is not, init replaces "dev" with the module version of the build
// information. It is a var only because the linker can set nothing else.
var Version = "dev"

// Commit is set at link time with
// -X github.com/nstance-dev/nstance/internal/version.Commit=<git rev-parse HEAD>;
// when it is not, init takes vcs.revision (and vcs.modified) from the
// build information, else it stays "unknown".
var Commit = ""

// Unknown is the commit of a build without VCS information.
const Unknown = "unknown"

func init() {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	Version, Commit = Resolve(Version, Commit, bi)
}

// Resolve decides the version and commit from the link-time stamps and the
// build information (nil when there is none). A stamp wins; "dev" and ""
// count as no stamp. The module version "(devel)" (a plain `go build`
// without VCS information) is no version either.
func Resolve(stamped, stampedCommit string, bi *debug.BuildInfo) (version, commit string) {
	version, commit = stamped, stampedCommit
	var revision string
	var modified bool
	if bi != nil {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if version == "" || version == "dev" {
		version = "dev"
		if bi != nil && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			version = bi.Main.Version
		}
	}
	if commit == "" {
		commit = Unknown
		if revision != "" {
			commit = revision
			if len(commit) > 12 {
				commit = commit[:12]
			}
			if modified {
				commit += "-dirty"
			}
		}
	}
	return version, commit
}

// String is what `<prog> --version` prints, the same in every binary:
// "<prog> <version> (<commit>, <go version>, <os>/<arch>)".
func String(prog string) string {
	return Format(prog, Version, Commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// Format is String with every part given.
func Format(prog, version, commit, goVersion, goos, goarch string) string {
	return fmt.Sprintf("%s %s (%s, %s, %s/%s)", prog, version, commit, goVersion, goos, goarch)
}

// Pattern is a regular expression matching one String line of prog (for
// tests that check a binary's --version).
func Pattern(prog string) string {
	return `^` + strings.ReplaceAll(prog, "-", `\-`) + ` \S+ \(\S+, go\S+, [a-z0-9]+/[a-z0-9]+\)$`
}
