package config

import (
	"io/fs"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nstance-dev/nstance/internal/logging"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func base() map[string]string {
	return map[string]string{
		EnvInstanceID:       "i-1",
		EnvRegistrationAddr: "127.0.0.1:8992",
		EnvAgentAddr:        "127.0.0.1:8994",
		EnvIdentityDir:      "/var/lib/nstance/identity",
	}
}

func TestLoadDefaults(t *testing.T) {
	c, err := Load(env(base()))
	require.NoError(t, err)
	require.Equal(t, "/var/lib/nstance/keys", c.KeysDir)
	require.Equal(t, "/var/lib/nstance/files", c.FilesDir)
	require.Equal(t, DefaultKeyFileMode, c.KeyFileMode)
	require.Equal(t, DefaultFileMode, c.FileMode)
	require.Equal(t, DefaultMetricsInterval, c.MetricsInterval)
	require.Equal(t, int64(DefaultMaxFileSize), c.MaxFileSize)
	require.Equal(t, []string{"/"}, c.DiskPaths)
	require.Equal(t, "127.0.0.1", c.ServerNameFor(c.AgentAddr))
	require.Equal(t, logging.Defaults(), c.Log)
	require.Equal(t, SpotNoticeAuto, c.SpotNotice, "spot notices when the metadata says spot")
	require.Equal(t, DefaultSpotPollInterval, c.SpotPollInterval)
}

func TestLoadOverrides(t *testing.T) {
	m := base()
	m[EnvKeysDir] = "/k"
	m[EnvFilesDir] = "/f"
	m[EnvKeyFileMode] = "0400"
	m[EnvFileMode] = "0o640"
	m[EnvMaxFileSize] = "2048"
	m[EnvMetricsInterval] = "1s"
	m[EnvDiskPaths] = "/var, /"
	m[EnvServerName] = "nstance.local"
	m[EnvLogLevel] = "2"
	m[EnvLogFormat] = "text"
	m[EnvSpotNotice] = "imds"
	m[EnvSpotPollInterval] = "2s"
	m[EnvIMDSEndpoint] = "http://127.0.0.1:1338"
	m[EnvHealthAddr] = ":8081"
	c, err := Load(env(m))
	require.NoError(t, err)
	require.Equal(t, "/k", c.KeysDir)
	require.Equal(t, "/f", c.FilesDir)
	require.Equal(t, fs.FileMode(0o400), c.KeyFileMode)
	require.Equal(t, fs.FileMode(0o640), c.FileMode)
	require.Equal(t, int64(2048), c.MaxFileSize)
	require.Equal(t, time.Second, c.MetricsInterval)
	require.Equal(t, []string{"/", "/var"}, c.DiskPaths)
	require.Equal(t, "nstance.local", c.ServerNameFor(c.AgentAddr))
	require.Equal(t, logging.Options{Level: "2", Format: "text"}, c.Log)
	require.Equal(t, "imds", c.SpotNotice)
	require.Equal(t, 2*time.Second, c.SpotPollInterval)
	require.Equal(t, "http://127.0.0.1:1338", c.IMDSEndpoint)
	require.Equal(t, ":8081", c.HealthAddr)
}

func TestLoadErrorsNameTheVariable(t *testing.T) {
	for _, tc := range []struct {
		name, key, value, want string
	}{
		{"missing id", EnvInstanceID, "", EnvInstanceID + ": required"},
		{"bad addr", EnvAgentAddr, "nohost", EnvAgentAddr + `: "nohost" is not host:port`},
		{"bad port", EnvRegistrationAddr, "h:99999", EnvRegistrationAddr + ": port"},
		{"missing identity", EnvIdentityDir, "", EnvIdentityDir + ": required"},
		{"bad mode", EnvFileMode, "0999", EnvFileMode + ": "},
		{"unreadable mode", EnvKeyFileMode, "0200", "does not let the owner read"},
		{"bad size", EnvMaxFileSize, "-1", EnvMaxFileSize},
		{"huge size", EnvMaxFileSize, "999999999999", EnvMaxFileSize},
		{"bad interval", EnvMetricsInterval, "0s", EnvMetricsInterval},
		{"backoff order", EnvReconnectMin, "1m", EnvReconnectMax},
		{"relative disk", EnvDiskPaths, "var", EnvDiskPaths},
		{"same dirs", EnvFilesDir, "/var/lib/nstance/identity", "must differ"},
		{"log level", EnvLogLevel, "loud", EnvLogLevel + `: log level "loud"`},
		{"log format", EnvLogFormat, "xml", EnvLogFormat + `: log format "xml"`},
		{"spot notice source", EnvSpotNotice, "azure", EnvSpotNotice + `: "azure" is not auto, imds, gcp or off`},
		{"imds endpoint", EnvIMDSEndpoint, "169.254.169.254", EnvIMDSEndpoint + ": "},
		{"spot poll interval", EnvSpotPollInterval, "-5s", EnvSpotPollInterval},
		{"health addr", EnvHealthAddr, "8080", EnvHealthAddr + `: "8080" is not host:port`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := base()
			m[tc.key] = tc.value
			_, err := Load(env(m))
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, err := Load(env(map[string]string{}))
	var ce *Error
	require.ErrorAs(t, err, &ce)
	require.Len(t, ce.Problems, 4, "every missing variable is reported at once")
}
