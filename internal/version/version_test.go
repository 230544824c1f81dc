package version

import (
	"regexp"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestResolve(t *testing.T) {
	vcs := func(main string, settings ...string) *debug.BuildInfo {
		bi := &debug.BuildInfo{Main: debug.Module{Path: "github.com/nstance-dev/nstance", Version: main}}
		for i := 0; i+1 < len(settings); i += 2 {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
		}
		return bi
	}
	const rev = "0123456789abcdef0123456789abcdef01234567"
	tests := []struct {
		name                   string
		stamped, stampedCommit string
		bi                     *debug.BuildInfo
		version, commit        string
	}{
		{"no build info", "dev", "", nil, "dev", Unknown},
		{"go install @tag", "dev", "", vcs("v0.3.0"), "v0.3.0", Unknown},
		{"go build in a checkout", "dev", "", vcs("v0.3.1-0.20261127120000-0123456789ab+dirty", "vcs.revision", rev, "vcs.modified", "true"),
			"v0.3.1-0.20261127120000-0123456789ab+dirty", "0123456789ab-dirty"},
		{"clean checkout", "", "", vcs("(devel)", "vcs.revision", rev, "vcs.modified", "false"), "dev", "0123456789ab"},
		{"ldflags win", "v0.3.0", "abc", vcs("v9.9.9", "vcs.revision", rev), "v0.3.0", "abc"},
		{"stamped version, commit from vcs", "v0.3.0", "", vcs("(devel)", "vcs.revision", rev), "v0.3.0", "0123456789ab"},
		{"short revision kept", "dev", "", vcs("", "vcs.revision", "abc"), "dev", "abc"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, c := Resolve(tc.stamped, tc.stampedCommit, tc.bi)
			require.Equal(t, tc.version, v)
			require.Equal(t, tc.commit, c)
		})
	}
}

func TestStringMatchesPattern(t *testing.T) {
	require.Equal(t, "nstance-server v0.3.0 (abc, go1.26.0, linux/amd64)",
		Format("nstance-server", "v0.3.0", "abc", "go1.26.0", "linux", "amd64"))
	s := String("dev-k8s")
	require.Regexp(t, regexp.MustCompile(Pattern("dev-k8s")), s)
	require.NotRegexp(t, regexp.MustCompile(Pattern("dev-s3")), s)
}
