package cli

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	ucli "github.com/urfave/cli/v2"

	"github.com/nstance-dev/nstance/internal/cliconv"
	"github.com/nstance-dev/nstance/internal/logging"
	"github.com/nstance-dev/nstance/internal/testing/envscan"
	"github.com/nstance-dev/nstance/internal/version"
)

func TestValidateFlag(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonc")
	require.NoError(t, os.WriteFile(bad, []byte(`{"cluster": {"id": "c1", "colour": "blue"}}`), 0o600))
	example, err := os.ReadFile("../../../examples/config-tmux.jsonc")
	require.NoError(t, err)
	badOptions := filepath.Join(dir, "bad-options.jsonc")
	require.NoError(t, os.WriteFile(badOptions, []byte(strings.Replace(string(example),
		`"options": { "session": "nstance-dev-agents", "health_port": 8987 }`, `"options": { "sesion": "x", "command": "" }`, 1)), 0o600))
	badCommand := filepath.Join(dir, "bad-command.jsonc")
	require.NoError(t, os.WriteFile(badCommand, []byte(strings.Replace(string(example),
		`"options": { "session": "nstance-dev-agents", "health_port": 8987 }`, `"options": { "command": "" }`, 1)), 0o600))
	badKind := filepath.Join(dir, "bad-kind.jsonc")
	require.NoError(t, os.WriteFile(badKind, []byte(strings.Replace(string(example), `"provider": "tmux"`, `"provider": "gce"`, 1)), 0o600))
	badLB := filepath.Join(dir, "bad-lb.jsonc")
	require.NoError(t, os.WriteFile(badLB, []byte(strings.Replace(string(example), `"templates": {`,
		`"load_balancers": { "www": { "provider": "haproxy", "socket": "/run/haproxy/admin.sock", "backend": "www", "port": 8080, "drain_dealy": "5s" } }, "templates": {`, 1)), 0o600))
	tests := []struct {
		name    string
		args    []string
		wantOut string
		wantErr string
	}{
		{"load balancer settings", []string{"--shard", "dev-1", "--validate", "--config-file", badLB},
			badLB + ": load_balancers.www.drain_dealy: unknown key\n", "1 problem"},
		{"example is valid", []string{"--shard", "dev-1", "--validate", "--config-file", "../../../examples/config-tmux.jsonc"}, "valid", ""},
		{"aws example is valid", []string{"--shard", "use1-az1", "--validate", "--config-file", "../../../examples/config-aws.jsonc"}, "valid", ""},
		{"gcp example is valid", []string{"--shard", "europe-west4-a", "--validate", "--config-file", "../../../examples/config-gcp.jsonc"}, "valid", ""},
		{"proxmox example is valid", []string{"--shard", "pve-a", "--validate", "--config-file", "../../../examples/config-proxmox.jsonc"}, "valid", ""},
		{"shard mismatch", []string{"--shard", "dev-2", "--validate", "--config-file", "../../../examples/config-tmux.jsonc"}, `shard.id: is "dev-1", but --shard is "dev-2"`, "1 problem"},
		{"unknown key", []string{"--shard", "dev-1", "--validate", "--config-file", bad}, "cluster.colour: unknown key", "1 problem"},
		{"provider options", []string{"--shard", "dev-1", "--validate", "--config-file", badOptions},
			badOptions + ": shard.infra.options.sesion: unknown key\n", "1 problem"},
		{"provider option value", []string{"--shard", "dev-1", "--validate", "--config-file", badCommand},
			badCommand + ": shard.infra.options.command: must not be empty (default air -c scripts/air/agent.toml)\n", "1 problem"},
		{"provider kind", []string{"--shard", "dev-1", "--validate", "--config-file", badKind},
			`shard.infra.provider: unknown provider "gce" (want one of aws, gcp, mock, process, proxmox, tmux)`, "1 problem"},
		{"missing file", []string{"--shard", "dev-1", "--validate", "--config-file", filepath.Join(dir, "nope")}, "", "reading"},
		{"config-file without validate", []string{"--shard", "dev-1", "--config-file", bad}, "", "only used with --validate"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := App()
			var out bytes.Buffer
			a.Writer, a.ErrWriter = &out, &out
			a.ExitErrHandler = func(*ucli.Context, error) {} // keep the test process alive
			err := a.Run(append([]string{"nstance-server"}, tc.args...))
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
			} else {
				require.NoError(t, err)
			}
			require.Contains(t, out.String(), tc.wantOut)
		})
	}
}

func TestLogFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want logging.Options
	}{
		{"defaults", nil, nil, logging.Defaults()},
		{"flags", []string{"--log-level", "warn", "--log-format", "text"}, nil, logging.Options{Level: "warn", Format: "text"}},
		{"env", nil, map[string]string{"NSTANCE_LOG_LEVEL": "2", "NSTANCE_LOG_FORMAT": "json"}, logging.Options{Level: "2", Format: "json"}},
		{"flag beats env", []string{"--log-level", "error"}, map[string]string{"NSTANCE_LOG_LEVEL": "debug"}, logging.Options{Level: "error", Format: "auto"}},
		{"deprecated --debug", []string{"--debug"}, nil, logging.Options{Level: "debug", Format: "auto"}},
		{"deprecated NSTANCE_DEBUG", nil, map[string]string{"NSTANCE_DEBUG": "true"}, logging.Options{Level: "debug", Format: "auto"}},
		{"explicit level beats --debug", []string{"--debug", "--log-level", "warn"}, nil, logging.Options{Level: "warn", Format: "auto"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"NSTANCE_LOG_LEVEL", "NSTANCE_LOG_FORMAT", "NSTANCE_DEBUG"} {
				t.Setenv(k, tc.env[k])
				if _, ok := tc.env[k]; !ok {
					require.NoError(t, os.Unsetenv(k))
				}
			}
			a := App()
			var got logging.Options
			a.Action = func(c *ucli.Context) error { got = logOptions(c); return nil }
			require.NoError(t, a.Run(append([]string{"nstance-server", "--shard", "s"}, tc.args...)))
			require.Equal(t, tc.want, got)
		})
	}
}

func TestHelpAndVersion(t *testing.T) {
	a := App()
	var out bytes.Buffer
	a.Writer = &out
	require.NoError(t, a.Run([]string{"nstance-server", "--help"}))
	require.Contains(t, out.String(), "--log-level")
	require.Contains(t, out.String(), "NSTANCE_LOG_FORMAT")
	require.NotContains(t, out.String(), "--debug", "the deprecated alias stays hidden")

	out.Reset()
	a = App()
	a.Writer = &out
	require.NoError(t, a.Run([]string{"nstance-server", "--version"}))
	require.Regexp(t, version.Pattern(Name), strings.TrimSpace(out.String()))
}

// TestHelpListsEveryVariable: every NSTANCE_* name in the code
// nstance-server links is in its --help, but for the agent's variables the
// local providers and the AWS user data set for instances.
func TestHelpListsEveryVariable(t *testing.T) {
	a := App()
	var out bytes.Buffer
	a.Writer = &out
	require.NoError(t, a.Run([]string{Name, "--help"}))
	found, err := envscan.Literals("github.com/nstance-dev/nstance/cmd/nstance-server", envscan.Names)
	require.NoError(t, err)
	require.Contains(t, found, "NSTANCE_STORAGE_BUCKET", "sanity: the scan sees this package")
	forInstances := map[string]bool{
		"github.com/nstance-dev/nstance/internal/server/provider/localagent": true,
		"github.com/nstance-dev/nstance/internal/server/provider/aws":        true,
	}
	hidden := map[string]bool{"NSTANCE_DEBUG": true, "NSTANCE_NONCE_SWEEP_INTERVAL": true} // deprecated; tests
	for name, pkgs := range found {
		read := false
		for _, p := range pkgs {
			read = read || !forInstances[p]
		}
		if !read || hidden[name] {
			continue
		}
		require.Regexp(t, `\b`+regexp.QuoteMeta(name)+`\b`, out.String(), "--help does not list %s (in %v)", name, pkgs)
	}
}

func TestBadLogLevelIsRefused(t *testing.T) {
	a := App()
	var out bytes.Buffer
	a.Writer, a.ErrWriter = &out, &out
	a.ExitErrHandler = func(*ucli.Context, error) {}
	err := a.Run([]string{"nstance-server", "--shard", "s", "--log-level", "loud"})
	require.ErrorContains(t, err, `log level "loud"`)
	var errOut bytes.Buffer
	require.Equal(t, cliconv.ExitUsage, cliconv.Report(&errOut, Name, err))
	require.Equal(t, "nstance-server: log level \"loud\": want debug, info, warn, error or a verbosity number\nRun 'nstance-server --help' for usage.\n", errOut.String())
}

// TestStartupLogs: the version is logged first, and a start-up failure is one
// error line in the chosen format, without a stack trace.
func TestStartupLogs(t *testing.T) {
	a := App()
	var out, logs bytes.Buffer
	a.Writer, a.ErrWriter = &out, &logs
	a.ExitErrHandler = func(*ucli.Context, error) {}
	err := a.Run([]string{"nstance-server", "--shard", "s", "--storage", "file", "--log-format", "json"})
	var ec ucli.ExitCoder
	require.ErrorAs(t, err, &ec)
	require.Equal(t, 2, ec.ExitCode())
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	require.Len(t, lines, 2, logs.String())
	var started, failed map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &started))
	require.Equal(t, "starting", started["msg"])
	require.Equal(t, "nstance-server", started["binary"])
	require.Equal(t, version.Version, started["version"])
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &failed))
	require.Equal(t, "error", failed["level"])
	require.Contains(t, failed["error"], "--storage-dir is required")
	require.NotContains(t, failed, "stacktrace")
}
